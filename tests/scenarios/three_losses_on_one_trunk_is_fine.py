# Three losses on one trunk, each backward right after its loss: the trunk's graph is kept for
# the next loss and run three times in each iteration, on purpose. The trunk is computed again
# each iteration: nothing is carried over, nothing grows.
# expect: none
# outcome: ok
import torch
from torch import nn


def multitask_step(trunk, heads, opt, x):
    opt.zero_grad()
    features = trunk(x)
    for i, head in enumerate(heads):
        loss = head(features).pow(2).mean()
        loss.backward(retain_graph=i < len(heads) - 1)
    opt.step()


torch.manual_seed(0)
trunk = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
heads = [nn.Linear(8, 1) for _ in range(3)]
opt = torch.optim.SGD([*trunk.parameters(), *(p for h in heads for p in h.parameters())], lr=0.1)
for step in range(4):
    multitask_step(trunk, heads, opt, torch.randn(5, 4))
