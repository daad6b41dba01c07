# rlkit's SACTrainer.train_from_torch before PR 109: the policy loss is built through the Q-function,
# then the Q-function's optimizer steps before policy_loss.backward(). The step rewrote the Q weights
# that the policy loss's graph saved for the action gradient, so the policy's backward fails.
# expect: saved-tensor-modified
# outcome: raises RuntimeError
import torch
import torch.nn.functional as F
from torch import nn


class FlattenMlp(nn.Module):
    def __init__(self, input_size, hidden=8):
        super().__init__()
        self.fcs = nn.ModuleList([nn.Linear(input_size, hidden)])
        self.last_fc = nn.Linear(hidden, 1)

    def forward(self, *inputs):
        h = torch.cat(inputs, dim=1)
        for fc in self.fcs:
            h = F.relu(fc(h))  # @saved
        return self.last_fc(h)  # @saved


class TanhGaussianPolicy(nn.Module):
    def __init__(self, obs_dim, action_dim, hidden=8):
        super().__init__()
        self.fc = nn.Linear(obs_dim, hidden)
        self.mean = nn.Linear(hidden, action_dim)
        self.log_std = nn.Linear(hidden, action_dim)

    def forward(self, obs):
        h = F.relu(self.fc(obs))
        mean, log_std = self.mean(h), self.log_std(h).clamp(-20, 2)
        std = log_std.exp()
        pre_tanh = mean + std * torch.randn_like(mean)
        action = torch.tanh(pre_tanh)
        log_prob = torch.distributions.Normal(mean, std).log_prob(pre_tanh)
        log_prob = (log_prob - torch.log(1 - action.pow(2) + 1e-6)).sum(dim=1, keepdim=True)
        return action, log_prob


def soft_update_from_to(source, target, tau):
    for target_param, param in zip(target.parameters(), source.parameters()):
        target_param.data.copy_(target_param.data * (1.0 - tau) + param.data * tau)


class SACTrainer:
    def __init__(self, policy, qf1, target_qf1, discount=0.99, soft_target_tau=5e-3, alpha=0.1):
        self.policy, self.qf1, self.target_qf1 = policy, qf1, target_qf1
        self.discount, self.soft_target_tau, self.alpha = discount, soft_target_tau, alpha
        self.qf_criterion = nn.MSELoss()
        self.policy_optimizer = torch.optim.Adam(policy.parameters(), lr=3e-4)
        self.qf1_optimizer = torch.optim.Adam(qf1.parameters(), lr=3e-4)

    def train_from_torch(self, batch):
        rewards, terminals = batch['rewards'], batch['terminals']
        obs, actions, next_obs = batch['observations'], batch['actions'], batch['next_observations']

        new_obs_actions, log_pi = self.policy(obs)
        q_new_actions = self.qf1(obs, new_obs_actions)
        policy_loss = (self.alpha * log_pi - q_new_actions).mean()

        q1_pred = self.qf1(obs, actions)
        new_next_actions, new_log_pi = self.policy(next_obs)
        target_q_values = self.target_qf1(next_obs, new_next_actions) - self.alpha * new_log_pi
        q_target = rewards + (1. - terminals) * self.discount * target_q_values
        qf1_loss = self.qf_criterion(q1_pred, q_target.detach())

        self.qf1_optimizer.zero_grad()
        qf1_loss.backward()
        self.qf1_optimizer.step()  # @culprit

        self.policy_optimizer.zero_grad()
        policy_loss.backward()
        self.policy_optimizer.step()

        soft_update_from_to(self.qf1, self.target_qf1, self.soft_target_tau)


def random_batch(n=4, obs_dim=3, action_dim=2):
    return dict(observations=torch.randn(n, obs_dim), actions=torch.rand(n, action_dim) * 2 - 1,
                next_observations=torch.randn(n, obs_dim), rewards=torch.randn(n, 1),
                terminals=torch.zeros(n, 1))


torch.manual_seed(0)
policy = TanhGaussianPolicy(3, 2)
qf1, target_qf1 = FlattenMlp(5), FlattenMlp(5)
target_qf1.load_state_dict(qf1.state_dict())
trainer = SACTrainer(policy, qf1, target_qf1)
for _ in range(2):
    trainer.train_from_torch(random_batch())
