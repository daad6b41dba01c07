# requires_grad_() on a copy of the input batch, which is a leaf (the batch needs no grad): the
# usual way to ask for an input gradient.
# expect: none
# outcome: ok
import torch
from torch import nn


def input_gradient(model, images):
    images = images.clone()
    images.requires_grad_()
    model(images).logsumexp(dim=1).sum().backward()
    return images.grad


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
grads = input_gradient(model, torch.randn(5, 4))
