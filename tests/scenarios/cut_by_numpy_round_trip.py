# The output goes through NumPy for a custom metric and comes back as a new tensor: the chain
# to the weights is cut at the .detach() that NumPy needed.
# expect: graph-cut tensor=loss
# outcome: raises RuntimeError
import numpy as np
import torch

torch.manual_seed(0)
w = torch.randn(3, requires_grad=True)
x = torch.randn(5, 3)
pred = x @ w
clipped = torch.from_numpy(np.clip(pred.detach().numpy(), -1, 1))  # @culprit
loss = clipped.pow(2).mean()
loss.backward()
