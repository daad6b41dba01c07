# Writing through .detach() before the tensor is saved is harmless.
# expect: none
# outcome: ok
import torch

a = torch.randn(4, requires_grad=True)
b = a * 3
b.detach().clamp_(min=0)
c = (b * b).sum()
c.backward()
