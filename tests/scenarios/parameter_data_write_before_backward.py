# The second layer's weight is saved (the first layer's gradient needs it); zeroing it through
# .data before backward silently corrupts that gradient.
# expect: silent-data-mutation tensor=net.2.weight
# outcome: wrong-grad
import torch
from torch import nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
out = net(torch.randn(16, 4))  # @saved
net[2].weight.data.mul_(0.5)  # @culprit
out.mean().backward()
