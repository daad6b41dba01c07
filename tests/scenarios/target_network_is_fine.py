# DQN-style: the target network's output is detached on purpose; the online network, which the
# optimizer holds, gets its gradients.
# expect: none
# outcome: ok
import copy

import torch
from torch import nn

torch.manual_seed(0)
online = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
target = copy.deepcopy(online)
opt = torch.optim.Adam(online.parameters(), lr=1e-3)
for step in range(3):
    state, next_state = torch.randn(8, 4), torch.randn(8, 4)
    q = online(state).max(1).values
    q_next = target(next_state).max(1).values.detach()
    loss = nn.functional.smooth_l1_loss(q, 1.0 + 0.99 * q_next)
    opt.zero_grad()
    loss.backward()
    opt.step()
