# An ablation study: a forward hook zeroes two units of a Sigmoid's output in place, but Sigmoid
# saved its output for backward. The hook's lines run in the middle of the ops of `model(x)`: the
# tensor is the hook's `output`, not the `loss` the calling line assigns.
# expect: saved-tensor-modified tensor=output
# outcome: raises RuntimeError
import torch
from torch import nn


def ablate(module, inputs, output):
    output[:, :2] = 0  # @culprit


def main(model):
    model[1].register_forward_hook(ablate)
    x = torch.randn(3, 5)
    loss = model(x).sum()  # @saved
    loss.backward()


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(5, 6), nn.Sigmoid(), nn.Linear(6, 1))
main(model)
