# Self-attention splits one projection into q, k, v with chunk() and scales q in place: the three
# are views of one tensor, which PyTorch forbids changing in place ("Output 0 of Split is a view
# and is being modified inplace. This view is the output of a function that returns multiple views").
# expect: view-inplace tensor=q
# outcome: raises RuntimeError
import torch
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.scale = dim ** -0.5

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # @saved
        q *= self.scale  # @culprit
        attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        return attn @ v


torch.manual_seed(0)
model = SelfAttention(4)
model(torch.randn(2, 5, 4)).sum().backward()
