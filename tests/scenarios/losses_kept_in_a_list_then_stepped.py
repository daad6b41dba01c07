# Micro-batch losses are collected in a list first, then each is backpropagated with an optimizer
# step in between: the step changes weights the later losses saved. The model is made inside the
# function and only ever called inside other calls (`losses.append(model(xb).sum())`): it is
# named by the call that ran it, not by its class.
# expect: saved-tensor-modified tensor=model.2.weight
# outcome: raises RuntimeError
import torch
from torch import nn


def train(data):
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for xb in data.split(4):
        losses.append(model(xb).sum())  # @saved
    for loss in losses:
        opt.zero_grad()
        loss.backward()
        opt.step()  # @culprit


torch.manual_seed(0)
train(torch.randn(8, 6))
