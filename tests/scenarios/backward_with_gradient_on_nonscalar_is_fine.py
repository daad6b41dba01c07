# Input saliency: backward from the logits of one class for every sample, with an explicit
# gradient for each value (a vector-Jacobian product). A non-scalar backward that is meant.
# expect: none
# outcome: ok
import torch
from torch import nn


def saliency(model, images, target):
    images = images.clone().requires_grad_()
    logits = model(images)
    chosen = logits[:, target]
    chosen.backward(gradient=torch.ones_like(chosen))
    return images.grad.abs().amax(dim=1)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
maps = saliency(model, torch.randn(6, 4), target=1)
