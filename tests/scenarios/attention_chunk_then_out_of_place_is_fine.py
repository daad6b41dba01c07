# The same attention, scaling q out of place: chunk's views are only read.
# expect: none
# outcome: ok
import torch
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.scale = dim ** -0.5

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q * self.scale
        attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        return attn @ v


torch.manual_seed(0)
model = SelfAttention(4)
model(torch.randn(2, 5, 4)).sum().backward()
