# quantumiracle/Popular-RL-Algorithms' SAC v2 update (the question in #16): the Q target is built
# from the target critics and the policy's next action with grad on, and cut with
# `target_q_value.detach()` in each critic's loss; the policy and alpha are trained by their own
# losses and optimizers (alpha through its detached coefficient). 3-dim states, 1-dim actions.
# expect: none
# outcome: ok
import torch
from torch import nn
from torch.distributions import Normal
from torch.nn import functional as F


class SoftQNetwork(nn.Module):
    def __init__(self, num_inputs, num_actions, hidden_size=16):
        super().__init__()
        self.linear1 = nn.Linear(num_inputs + num_actions, hidden_size)
        self.linear2 = nn.Linear(hidden_size, 1)

    def forward(self, state, action):
        return self.linear2(F.relu(self.linear1(torch.cat([state, action], 1))))


class PolicyNetwork(nn.Module):
    def __init__(self, num_inputs, num_actions, hidden_size=16, action_range=1.0):
        super().__init__()
        self.linear1 = nn.Linear(num_inputs, hidden_size)
        self.mean_linear = nn.Linear(hidden_size, num_actions)
        self.log_std_linear = nn.Linear(hidden_size, num_actions)
        self.action_range = action_range

    def forward(self, state):
        x = F.relu(self.linear1(state))
        return self.mean_linear(x), torch.clamp(self.log_std_linear(x), -20, 2)

    def evaluate(self, state, epsilon=1e-6):
        mean, log_std = self.forward(state)
        std = log_std.exp()
        z = Normal(0, 1).sample(mean.shape)
        action_0 = torch.tanh(mean + std * z)
        action = self.action_range * action_0
        log_prob = Normal(mean, std).log_prob(mean + std * z) - torch.log(1. - action_0.pow(2) + epsilon) \
            - torch.log(torch.tensor(self.action_range))
        return action, log_prob.sum(dim=1, keepdim=True)


class SAC_Trainer:
    def __init__(self, state_dim=3, action_dim=1, lr=3e-3):
        self.soft_q_net1, self.soft_q_net2 = SoftQNetwork(state_dim, action_dim), SoftQNetwork(state_dim, action_dim)
        self.target_soft_q_net1, self.target_soft_q_net2 = SoftQNetwork(state_dim, action_dim), SoftQNetwork(state_dim, action_dim)
        for target, net in ((self.target_soft_q_net1, self.soft_q_net1), (self.target_soft_q_net2, self.soft_q_net2)):
            for target_param, param in zip(target.parameters(), net.parameters()):
                target_param.data.copy_(param.data)
        self.policy_net = PolicyNetwork(state_dim, action_dim)
        self.log_alpha = torch.zeros(1, dtype=torch.float32, requires_grad=True)
        self.soft_q_criterion1, self.soft_q_criterion2 = nn.MSELoss(), nn.MSELoss()
        self.soft_q_optimizer1 = torch.optim.Adam(self.soft_q_net1.parameters(), lr=lr)
        self.soft_q_optimizer2 = torch.optim.Adam(self.soft_q_net2.parameters(), lr=lr)
        self.policy_optimizer = torch.optim.Adam(self.policy_net.parameters(), lr=lr)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=lr)

    def update(self, state, action, reward, next_state, done, gamma=0.99, soft_tau=1e-2, target_entropy=-1.):
        predicted_q_value1 = self.soft_q_net1(state, action)
        predicted_q_value2 = self.soft_q_net2(state, action)
        new_action, log_prob = self.policy_net.evaluate(state)
        new_next_action, next_log_prob = self.policy_net.evaluate(next_state)
        reward = (reward - reward.mean(dim=0)) / (reward.std(dim=0) + 1e-6)
        alpha_loss = -(self.log_alpha * (log_prob + target_entropy).detach()).mean()
        self.alpha_optimizer.zero_grad()
        alpha_loss.backward()
        self.alpha_optimizer.step()
        self.alpha = self.log_alpha.exp()
        target_q_min = torch.min(self.target_soft_q_net1(next_state, new_next_action),
                                 self.target_soft_q_net2(next_state, new_next_action)) - self.alpha * next_log_prob
        target_q_value = reward + (1 - done) * gamma * target_q_min
        q_value_loss1 = self.soft_q_criterion1(predicted_q_value1, target_q_value.detach())
        q_value_loss2 = self.soft_q_criterion2(predicted_q_value2, target_q_value.detach())
        self.soft_q_optimizer1.zero_grad()
        q_value_loss1.backward()
        self.soft_q_optimizer1.step()
        self.soft_q_optimizer2.zero_grad()
        q_value_loss2.backward()
        self.soft_q_optimizer2.step()
        predicted_new_q_value = torch.min(self.soft_q_net1(state, new_action), self.soft_q_net2(state, new_action))
        policy_loss = (self.alpha * log_prob - predicted_new_q_value).mean()
        self.policy_optimizer.zero_grad()
        policy_loss.backward()
        self.policy_optimizer.step()
        for target, net in ((self.target_soft_q_net1, self.soft_q_net1), (self.target_soft_q_net2, self.soft_q_net2)):
            for target_param, param in zip(target.parameters(), net.parameters()):
                target_param.data.copy_(target_param.data * (1.0 - soft_tau) + param.data * soft_tau)
        return predicted_new_q_value.mean()


torch.manual_seed(0)
trainer = SAC_Trainer()
for _ in range(2):
    trainer.update(torch.randn(5, 3), torch.rand(5, 1) * 2 - 1, torch.randn(5, 1), torch.randn(5, 3), torch.zeros(5, 1))
