# torch.nn.utils.prune on a LeNet's first conv: `conv1.weight` becomes weight_orig * weight_mask,
# recomputed before each forward, so it is not a leaf and its .grad reads None (the report took
# this for a bug). The gradient lands on conv1.weight_orig, the parameter the optimizer holds,
# and the masked entries get zero. Nothing to report.
# expect: none
# outcome: ok
import torch
import torch.nn.utils.prune as prune
from torch import nn


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 2, 3)
        self.conv2 = nn.Conv2d(2, 1, 3)

    def forward(self, x):
        x = self.conv1(x)
        x = self.conv2(x)
        return x


torch.manual_seed(0)
model = LeNet()
prune.random_unstructured(model.conv1, name="weight", amount=0.3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
lossfn = nn.L1Loss()
x = torch.ones(1, 8, 8, requires_grad=True)
z = torch.ones(1, 4, 4)
for _ in range(2):
    y = model(x)
    loss = lossfn(z, y)
    optimizer.zero_grad()
    loss.backward()
    conv1_weight_grad = model.conv1.weight.grad
    optimizer.step()
