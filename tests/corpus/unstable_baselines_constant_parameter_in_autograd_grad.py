# unstable_baselines kept a network's constant (the action scale of a squashed Gaussian policy) as
# nn.Parameter(..., requires_grad=False). An update that takes the policy gradient by hand with
# torch.autograd.grad(loss, policy.parameters()) then hands autograd.grad that constant too, and
# autograd.grad refuses a tensor that does not require grad. The project moved it to a buffer.
# expect: needs-grad tensor=policy.action_scale
# outcome: raises RuntimeError
import torch
from torch import nn


class GaussianPolicy(nn.Module):
    def __init__(self, obs_dim=4, act_dim=2):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(obs_dim, 8), nn.Tanh())
        self.mean = nn.Linear(8, act_dim)
        self.action_scale = nn.Parameter(torch.ones(act_dim) * 2.0, requires_grad=False)  # @culprit

    def forward(self, obs):
        return torch.tanh(self.mean(self.trunk(obs))) * self.action_scale


def manual_update(policy, obs, advantages, lr=1e-2):
    loss = -(policy(obs).sum(dim=1) * advantages).mean()
    grads = torch.autograd.grad(loss, policy.parameters())  # @saved
    with torch.no_grad():
        for param, g in zip(policy.parameters(), grads):
            param -= lr * g


torch.manual_seed(0)
policy = GaussianPolicy()
manual_update(policy, torch.randn(5, 4), torch.randn(5))
