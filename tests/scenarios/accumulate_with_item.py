# The right way: accumulate Python numbers.
# expect: none
# outcome: ok
import torch

w = torch.randn(4, requires_grad=True)
total = 0.0
for step in range(5):
    loss = (w * torch.randn(4)).pow(2).sum()
    loss.backward()
    total += loss.item()
