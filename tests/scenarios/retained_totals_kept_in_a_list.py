# Two heads on one trunk; the total is backpropagated with retain_graph=True (for a gradient
# penalty that was removed since) and appended to a list for logging. Each step's whole graph, with
# its saved activations, stays alive in the list.
# expect: accumulated-graph tensor=total
# outcome: ok
import torch
from torch import nn

torch.manual_seed(0)
trunk = nn.Sequential(nn.Linear(6, 12), nn.ReLU())
cls_head, reg_head = nn.Linear(12, 3), nn.Linear(12, 1)
params = [*trunk.parameters(), *cls_head.parameters(), *reg_head.parameters()]
opt = torch.optim.SGD(params, lr=0.05)
totals = []
for step in range(5):
    x, labels, targets = torch.randn(8, 6), torch.randint(0, 3, (8,)), torch.randn(8, 1)
    features = trunk(x)
    total = nn.functional.cross_entropy(cls_head(features), labels) + nn.functional.mse_loss(reg_head(features), targets)
    opt.zero_grad()
    total.backward(retain_graph=True)
    opt.step()
    totals.append(total)  # @culprit
