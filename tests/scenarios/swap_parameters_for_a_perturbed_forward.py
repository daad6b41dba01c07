# A sharpness-aware step: a context manager swaps perturbed values into the parameters for the
# forward pass and "restores" them in its `finally`, before the gradient is taken. The graph kept
# the parameter objects themselves (`h @ self.w2` saves `self.w2` for the first layer's gradient),
# so backward reads the restored values: `w1`'s gradient is silently wrong.
# expect: silent-data-mutation tensor=model.w2
# outcome: wrong-grad
import contextlib

import torch
from torch import nn


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(4, 8) * 0.5)
        self.w2 = nn.Parameter(torch.randn(8, 2) * 0.5)

    def forward(self, x):
        h = torch.tanh(x @ self.w1)
        return h @ self.w2  # @saved


@contextlib.contextmanager
def perturbed(module, radius):
    originals = {name: p.data for name, p in module.named_parameters()}
    try:
        for name, p in module.named_parameters():
            p.data = p.data + radius * torch.sign(p.data)
        yield
    finally:
        for name, p in module.named_parameters():
            p.data = originals[name]  # @culprit


torch.manual_seed(0)
model = TwoLayer()
x, y = torch.randn(16, 4), torch.randn(16, 2)
with perturbed(model, 0.05):
    pred = model(x)
loss = nn.functional.mse_loss(pred, y)
loss.backward()
