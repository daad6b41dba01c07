# Two losses on one trunk: the first backward retains the graph for the second, then the step
# changes the weights both graphs saved. No later backward runs through them: nothing to report.
# expect: none
# outcome: ok
import torch
from torch import nn


def train_step(trunk, head_a, head_b, opt, x):
    features = trunk(x)
    loss_a = head_a(features).pow(2).mean()
    loss_b = head_b(features).abs().mean()
    opt.zero_grad()
    loss_a.backward(retain_graph=True)
    loss_b.backward()
    opt.step()
    return loss_a.item() + loss_b.item()


torch.manual_seed(0)
trunk = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
head_a, head_b = nn.Linear(8, 1), nn.Linear(8, 2)
opt = torch.optim.SGD([*trunk.parameters(), *head_a.parameters(), *head_b.parameters()], lr=0.1)
for step in range(3):
    train_step(trunk, head_a, head_b, opt, torch.randn(5, 4))
