# The classic non-fix: the loss was rebuilt from .item(), backward raised, and the user set
# loss.requires_grad = True. Now nothing raises, and no weight ever gets a gradient.
# expect: graph-cut tensor=loss
# outcome: ok
import torch

torch.manual_seed(0)
w = torch.randn(3, requires_grad=True)
x = torch.randn(5, 3)
loss = torch.tensor((x @ w).pow(2).mean().item())  # @culprit
loss.requires_grad = True
loss.backward()
