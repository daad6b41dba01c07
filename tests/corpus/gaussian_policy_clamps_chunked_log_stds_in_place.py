# A GAIL/AIRL PPO expert's state-dependent Gaussian policy splits one network output into means and
# log-stds with `.chunk(2, dim=-1)` and clamps the log-stds in place, `log_stds.clamp_(-20, 2)`.
# chunk returns several views of one tensor, which PyTorch forbids writing in place: the sampling
# call raises before any loss is computed.
# expect: view-inplace tensor=log_stds
# outcome: raises RuntimeError
import math

import torch
from torch import nn


def calculate_log_pi(log_stds, noises, actions):
    gaussian_log_probs = (-0.5 * noises.pow(2) - log_stds).sum(dim=-1, keepdim=True) \
        - 0.5 * math.log(2 * math.pi) * log_stds.size(-1)
    return gaussian_log_probs - torch.log(1 - actions.pow(2) + 1e-6).sum(dim=-1, keepdim=True)


def reparameterize(means, log_stds):
    noises = torch.randn_like(means)
    us = means + noises * log_stds.exp()
    actions = torch.tanh(us)
    return actions, calculate_log_pi(log_stds, noises, actions)


class StateDependentPolicy(nn.Module):
    def __init__(self, state_dim=3, action_dim=2, hidden=8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(state_dim, hidden), nn.ReLU(), nn.Linear(hidden, 2 * action_dim))

    def forward(self, states):
        return torch.tanh(self.net(states).chunk(2, dim=-1)[0])

    def sample(self, states):
        means, log_stds = self.net(states).chunk(2, dim=-1)  # @saved
        return reparameterize(means, log_stds.clamp_(-20, 2))  # @culprit


def update_actor(actor, optim_actor, states, alpha=0.2):
    actions, log_pis = actor.sample(states)
    loss_actor = (alpha * log_pis - actions.sum(dim=-1, keepdim=True)).mean()
    optim_actor.zero_grad()
    loss_actor.backward()
    optim_actor.step()


torch.manual_seed(0)
actor = StateDependentPolicy()
update_actor(actor, torch.optim.Adam(actor.parameters(), lr=3e-4), torch.randn(4, 3))
