# WGAN-style weight clipping through .data after the step: the graph is already consumed.
# expect: none
# outcome: ok
import torch
from torch import nn

torch.manual_seed(0)
critic = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(critic.parameters(), lr=0.1)
for step in range(3):
    loss = critic(torch.randn(16, 4)).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    for p in critic.parameters():
        p.data.clamp_(-0.01, 0.01)
