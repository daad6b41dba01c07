# A Poisson regression head maps its output to a positive rate with torch.where(a <= 0, exp(a),
# 1 + a), meant to keep exp from overflowing for large outputs. The forward is finite, but exp
# is still computed for every element, and for the large ones its backward multiplies a zero
# gradient by inf: the weights get NaN gradients (the unused branch's NaN flows back).
# expect: nan-gradient
# outcome: ok
# capture: check_nan=True
import torch
from torch import nn


class ExpLinearRate(nn.Module):
    def forward(self, a):
        return torch.where(a <= 0, torch.exp(a), 1 + a)  # @culprit


class CountModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
        self.rate = ExpLinearRate()

    def forward(self, x):
        return self.rate(self.body(x)).squeeze(1)


def train_step(model, optimizer, x, counts):
    optimizer.zero_grad()
    loss = nn.functional.poisson_nll_loss(model(x), counts, log_input=False)
    loss.backward()
    optimizer.step()
    return loss.item()


torch.manual_seed(0)
model = CountModel()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(6, 3)
x[2] *= 5000  # a row of raw, unscaled features: its output is about 115
counts = torch.poisson(torch.full((6,), 3.0))
train_step(model, optimizer, x, counts)
