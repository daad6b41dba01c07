# Changing one row of a parameter in place: a view of a leaf is still the leaf.
# expect: leaf-inplace tensor=w
# outcome: raises RuntimeError
import torch

w = torch.randn(3, 4, requires_grad=True)
w[0].mul_(2)  # @culprit
