# A REINFORCE loss written by a formatter over several lines: `log_prob` is made by a statement of
# three lines and used inside the function only. The write into its first step (through a view)
# changes what `log_prob ** 2` saved; the diagnosis says `log_prob`, not "the result of
# Tensor.squeeze".
# expect: saved-tensor-modified tensor=log_prob
# outcome: raises RuntimeError
import torch
from torch import nn
from torch.distributions import Categorical


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, obs):
        return Categorical(logits=self.body(obs))


def reinforce_loss(policy, obs, actions, returns):
    dist = policy(obs)
    log_prob = dist.log_prob(
        actions
    ).squeeze(-1)
    regulariser = 0.01 * (log_prob ** 2).mean()  # @saved
    first = log_prob[:1]
    first.zero_()  # @culprit
    return -(log_prob * returns).mean() + regulariser


torch.manual_seed(0)
policy = Policy()
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
for episode in range(2):
    obs = torch.randn(6, 4)
    actions = torch.randint(0, 3, (6,))
    returns = torch.linspace(1.0, 0.5, 6)
    loss = reinforce_loss(policy, obs, actions, returns)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
