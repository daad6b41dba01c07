# Custom weight init through model.apply, writing the parameters in place without torch.no_grad():
# PyTorch refuses, at the write, inside the init function. The parameter goes by the receiver of
# that line (`m.weight`): the model has not been called yet, so no module path names it.
# expect: leaf-inplace tensor=m.weight
# outcome: raises RuntimeError
import torch
from torch import nn


def init_weights(m):
    if isinstance(m, nn.Linear):
        m.weight.uniform_(-0.1, 0.1)  # @culprit


def build():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    model.apply(init_weights)
    return model


torch.manual_seed(0)
model = build()
model(torch.randn(2, 4)).sum().backward()
