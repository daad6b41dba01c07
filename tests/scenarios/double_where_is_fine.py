# The safe form of the previous scenario: the input of sqrt is made safe first.
# expect: none
# outcome: ok
# capture: check_nan=True
import torch

torch.manual_seed(0)
x = torch.randn(6, requires_grad=True)
safe = torch.where(x > 0, x, torch.ones_like(x))
y = torch.where(x > 0, safe.sqrt(), torch.zeros_like(x))
y.sum().backward()
