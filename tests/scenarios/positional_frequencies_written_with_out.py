# A rotary embedding keeps its frequencies in a parameter and refills them with `torch.arange(...,
# out=self.freq)` outside `no_grad`. An `out=` write into a leaf that requires grad is an in-place
# change of that leaf: PyTorch refuses it ("functions with out=... arguments don't support
# automatic differentiation"), naming neither the tensor nor the line.
# expect: leaf-inplace tensor=self.freq
# outcome: raises RuntimeError
import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    def __init__(self, dim, base=10000.0):
        super().__init__()
        self.base = base
        self.freq = nn.Parameter(torch.empty(dim // 2))
        self.reset_parameters()

    def reset_parameters(self):
        torch.arange(self.freq.numel(), out=self.freq)  # @culprit
        self.freq.data = self.base ** (-2 * self.freq.data / (2 * self.freq.numel()))

    def forward(self, positions):
        angles = positions[:, None] * self.freq[None, :]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)


rope = RotaryEmbedding(8)
features = rope(torch.arange(5.0))
features.sum().backward()
