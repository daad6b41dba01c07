# TianhongDai's SAC update (rl_algorithms/sac/sac_agent.py, `_update_newtork`) with the change the
# report applies to get past the in-place error: the critics are stepped before the actor's
# backward, so the critic value in the actor loss is detached. PyTorch raises nothing, but the
# policy is then trained by its entropy term alone: the critic's value no longer trains it.
# expect: graph-cut
# outcome: ok
import copy

import torch
from torch import nn
from torch.distributions.normal import Normal
from torch.nn import functional as F


class Actor(nn.Module):
    def __init__(self, obs_dim, action_dim, hidden=16):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.mean = nn.Linear(hidden, action_dim)
        self.log_std = nn.Linear(hidden, action_dim)

    def forward(self, x):
        x = F.relu(self.fc2(F.relu(self.fc1(x))))
        return self.mean(x), self.log_std(x).clamp(-20, 2)


class QNetwork(nn.Module):
    def __init__(self, obs_dim, action_dim, hidden=16):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim + action_dim, hidden)
        self.q = nn.Linear(hidden, 1)

    def forward(self, obs, action):
        return self.q(F.relu(self.fc1(torch.cat([obs, action], dim=1))))


class get_action_info:
    def __init__(self, pis):
        mean, log_std = pis
        self.dist = Normal(mean, log_std.exp())

    def select_actions(self, reparameterize=False):
        pre_tanh_value = self.dist.rsample() if reparameterize else self.dist.sample()
        return torch.tanh(pre_tanh_value), pre_tanh_value

    def get_log_prob(self, actions, pre_tanh_value):
        log_prob = self.dist.log_prob(pre_tanh_value).sum(dim=1, keepdim=True)
        return log_prob - torch.log(1 - actions.pow(2) + 1e-6).sum(dim=1, keepdim=True)


class SACAgent:
    def __init__(self, obs_dim=3, action_dim=2, lr=3e-3, gamma=0.99, reward_scale=1.0):
        self.gamma, self.reward_scale = gamma, reward_scale
        self.actor_net = Actor(obs_dim, action_dim)
        self.qf1, self.qf2 = QNetwork(obs_dim, action_dim), QNetwork(obs_dim, action_dim)
        self.target_qf1, self.target_qf2 = copy.deepcopy(self.qf1), copy.deepcopy(self.qf2)
        self.qf1_optim = torch.optim.Adam(self.qf1.parameters(), lr=lr)
        self.qf2_optim = torch.optim.Adam(self.qf2.parameters(), lr=lr)
        self.actor_optim = torch.optim.Adam(self.actor_net.parameters(), lr=lr)
        self.target_entropy = -action_dim
        self.log_alpha = torch.zeros(1, requires_grad=True)
        self.alpha_optim = torch.optim.Adam([self.log_alpha], lr=lr)

    def _update_newtork(self, obses, actions, rewards, obses_, inverse_dones):
        pis = self.actor_net(obses)
        actions_info = get_action_info(pis)
        actions_, pre_tanh_value = actions_info.select_actions(reparameterize=True)
        log_prob = actions_info.get_log_prob(actions_, pre_tanh_value)
        alpha_loss = -(self.log_alpha * (log_prob + self.target_entropy).detach()).mean()
        self.alpha_optim.zero_grad()
        alpha_loss.backward()
        self.alpha_optim.step()
        alpha = self.log_alpha.exp()
        q_actions_ = torch.min(self.qf1(obses, actions_), self.qf2(obses, actions_))
        actor_loss = (alpha * log_prob - q_actions_.detach()).mean()  # @culprit
        q1_value = self.qf1(obses, actions)
        q2_value = self.qf2(obses, actions)
        with torch.no_grad():
            pis_next = self.actor_net(obses_)
            actions_info_next = get_action_info(pis_next)
            actions_next_, pre_tanh_value_next = actions_info_next.select_actions(reparameterize=True)
            log_prob_next = actions_info_next.get_log_prob(actions_next_, pre_tanh_value_next)
            target_q_value_next = torch.min(self.target_qf1(obses_, actions_next_),
                                            self.target_qf2(obses_, actions_next_)) - alpha * log_prob_next
            target_q_value = self.reward_scale * rewards + inverse_dones * self.gamma * target_q_value_next
        qf1_loss = (q1_value - target_q_value).pow(2).mean()
        qf2_loss = (q2_value - target_q_value).pow(2).mean()
        self.qf1_optim.zero_grad()
        qf1_loss.backward()
        self.qf1_optim.step()
        self.qf2_optim.zero_grad()
        qf2_loss.backward()
        self.qf2_optim.step()
        self.actor_optim.zero_grad()
        actor_loss.backward()
        self.actor_optim.step()
        return qf1_loss.item(), qf2_loss.item(), actor_loss.item(), alpha.item(), alpha_loss.item()


torch.manual_seed(0)
agent = SACAgent()
actor_net, qf1, qf2 = agent.actor_net, agent.qf1, agent.qf2
for _ in range(2):
    batch = (torch.randn(6, 3), torch.rand(6, 2) * 2 - 1, torch.randn(6, 1), torch.randn(6, 3), torch.ones(6, 1))
    agent._update_newtork(*batch)
