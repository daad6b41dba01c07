# rai-toolbox's `freeze(*items)` context helper records each parameter's requires_grad and calls
# `param.requires_grad_(False)` on it, restoring the flags on exit. Handed a perturbed copy of the
# data (`2 * x`, computed from a tensor that requires grad) along with a model, it tries to change the
# flag of a non-leaf and raises.
# expect: nonleaf-requires-grad
# outcome: raises RuntimeError
from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def freeze(*items):
    param_states = {}
    for item in items:
        params = item.parameters() if isinstance(item, nn.Module) else [item]
        for param in params:
            if param not in param_states:
                param_states[param] = param.requires_grad
                param.requires_grad_(False)  # @culprit
    try:
        yield
    finally:
        for p, requires_grad in param_states.items():
            p.requires_grad_(requires_grad)


def evaluate_robustness(model, x):
    x_adv = 2 * x  # @saved
    with freeze(model, x_adv):
        return model(x_adv).sum().item()


torch.manual_seed(0)
model = nn.Linear(3, 2)
x = torch.arange(3.0, requires_grad=True)
score = evaluate_robustness(model, x)
