# DimeNet's BesselBasisLayer keeps its radial frequencies as a Parameter and fills them in
# `reset_parameters` with `torch.arange(1, n + 1, out=self.freq).mul_(PI)`, called from `__init__`
# outside no_grad: an out= write into a leaf that requires grad, so building the model raises.
# expect: leaf-inplace
# outcome: raises RuntimeError
import math

import torch
from torch import nn

PI = math.pi


class Envelope(nn.Module):
    def __init__(self, exponent):
        super().__init__()
        self.p = exponent + 1

    def forward(self, x):
        return 1.0 / x + x.pow(self.p - 1) * (-self.p / 2)


class BesselBasisLayer(nn.Module):
    def __init__(self, num_radial, cutoff=5.0, envelope_exponent=5):
        super().__init__()
        self.cutoff = cutoff
        self.envelope = Envelope(envelope_exponent)
        self.freq = nn.Parameter(torch.empty(num_radial))
        self.reset_parameters()

    def reset_parameters(self):
        torch.arange(1, self.freq.numel() + 1, out=self.freq).mul_(PI)  # @culprit

    def forward(self, dist):
        dist = dist.unsqueeze(-1) / self.cutoff
        return self.envelope(dist) * (self.freq * dist).sin()


class DimeNet(nn.Module):
    def __init__(self, num_radial=3, cutoff=5.0):
        super().__init__()
        self.rbf = BesselBasisLayer(num_radial, cutoff)
        self.lin = nn.Linear(num_radial, 1)

    def forward(self, dist):
        return self.lin(self.rbf(dist)).sum()


torch.manual_seed(0)
model = DimeNet()
model(torch.rand(5) + 0.5).backward()
