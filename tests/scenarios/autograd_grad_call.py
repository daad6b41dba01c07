# The same bug reached through torch.autograd.grad instead of backward().
# expect: saved-tensor-modified tensor=s
# outcome: raises RuntimeError
import torch

x = torch.randn(6, requires_grad=True)
s = torch.tanh(x)  # @saved
s += 1  # @culprit
(g,) = torch.autograd.grad(s.sum(), x)
