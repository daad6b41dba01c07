# torch.where picks sqrt only where x > 0, yet the negative entries' sqrt is NaN in the branch
# that was not chosen, and its gradient (0 * NaN) still flows back.
# expect: nan-gradient
# outcome: ok
# capture: check_nan=True
import torch

torch.manual_seed(0)
x = torch.randn(6, requires_grad=True)
y = torch.where(x > 0, x.sqrt(), torch.zeros_like(x))  # @culprit
y.sum().backward()
