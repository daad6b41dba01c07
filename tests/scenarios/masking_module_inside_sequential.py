# A masking module of the user's own, in the middle of an nn.Sequential, writes the Sigmoid's
# output in place. The calling line `out = model(x)` names the model's output, not that tensor.
# expect: saved-tensor-modified tensor=x
# outcome: raises RuntimeError
import torch
from torch import nn


class ZeroFirst(nn.Module):
    def forward(self, x):
        x[:, 0] = 0  # @culprit
        return x


def step(model, x):
    out = model(x)  # @saved
    out.pow(2).mean().backward()


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 6), nn.Sigmoid(), ZeroFirst(), nn.Linear(6, 2))
step(model, torch.randn(3, 4))
