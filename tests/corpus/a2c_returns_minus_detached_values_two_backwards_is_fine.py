# bentrevett/pytorch-rl's actor-critic notebook (`update_policy`) after the fix discussed in #2: the
# policy loss is weighted by `(returns - values).detach()`, the value loss trains the critic, and
# the two backward calls accumulate into one optimizer over the actor-critic before its step.
# CartPole replaced by random 4-dim states over one episode of 5 steps.
# expect: none
# outcome: ok
import torch
from torch import nn
from torch.nn import functional as F
from torch import distributions


class MLP(nn.Module):
    def __init__(self, input_dim, hidden_dim, output_dim):
        super().__init__()
        self.fc_1, self.fc_2 = nn.Linear(input_dim, hidden_dim), nn.Linear(hidden_dim, output_dim)

    def forward(self, x):
        return self.fc_2(F.relu(self.fc_1(x)))


class ActorCritic(nn.Module):
    def __init__(self, actor, critic):
        super().__init__()
        self.actor, self.critic = actor, critic

    def forward(self, state):
        return self.actor(state), self.critic(state)


def calculate_returns(rewards, discount_factor, normalize=True):
    returns, R = [], 0
    for r in reversed(rewards):
        R = r + R * discount_factor
        returns.insert(0, R)
    returns = torch.tensor(returns)
    if normalize:
        returns = (returns - returns.mean()) / returns.std()
    return returns


def train(states, policy, optimizer, discount_factor=0.99):
    log_prob_actions, values, rewards = [], [], []
    for state in states:
        action_pred, value_pred = policy(state.unsqueeze(0))
        dist = distributions.Categorical(F.softmax(action_pred, dim=-1))
        action = dist.sample()
        log_prob_actions.append(dist.log_prob(action))
        values.append(value_pred)
        rewards.append(float(action.item() == 0))
    log_prob_actions = torch.cat(log_prob_actions)
    values = torch.cat(values).squeeze(-1)
    returns = calculate_returns(rewards, discount_factor)
    return update_policy(returns, log_prob_actions, values, optimizer)


def update_policy(returns, log_prob_actions, values, optimizer):
    advantages = (returns - values).detach()
    policy_loss = - (advantages * log_prob_actions).sum()
    value_loss = F.smooth_l1_loss(returns, values).sum()
    optimizer.zero_grad()
    policy_loss.backward()
    value_loss.backward()
    optimizer.step()
    return policy_loss.item(), value_loss.item()


torch.manual_seed(0)
policy = ActorCritic(MLP(4, 8, 2), MLP(4, 8, 1))
optimizer = torch.optim.Adam(policy.parameters(), lr=0.01)
for episode in range(2):
    train(torch.randn(5, 4), policy, optimizer)
