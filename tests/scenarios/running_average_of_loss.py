# An exponential moving average of the loss kept as a tensor links every iteration's graph.
# expect: accumulated-graph tensor=running
# outcome: ok
import torch

torch.manual_seed(0)
w = torch.randn(4, requires_grad=True)
running = torch.tensor(0.0)
for step in range(10):
    loss = (w * torch.randn(4)).pow(2).sum()
    loss.backward()
    running = 0.9 * running + 0.1 * loss  # @culprit
