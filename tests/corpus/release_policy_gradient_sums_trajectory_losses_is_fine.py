# ReLeaSE's Reinforcement.policy_gradient as published: every sampled character's log-probability,
# weighted by the discounted reward, is subtracted from `rl_loss`, a running sum over the batch's
# trajectories that starts at 0 on each call and gets one backward() at its end.
# expect: none
# outcome: ok
import torch
from torch import nn
from torch.nn import functional as F


class StackAugmentedRNN(nn.Module):
    def __init__(self, n_chars=6, hidden_size=8, lr=0.01):
        super().__init__()
        self.hidden_size = hidden_size
        self.encoder = nn.Embedding(n_chars, hidden_size)
        self.rnn = nn.GRUCell(hidden_size, hidden_size)
        self.decoder = nn.Linear(hidden_size, n_chars)
        self.optimizer = torch.optim.Adadelta(self.parameters(), lr=lr)

    def init_hidden(self):
        return torch.zeros(1, self.hidden_size)

    def forward(self, inp, hidden):
        hidden = self.rnn(self.encoder(inp.view(1)), hidden)
        return self.decoder(hidden), hidden


class Predictor:
    def __init__(self):
        self.model = nn.Linear(1, 1)

    def predict(self, trajectory):
        with torch.no_grad():
            return torch.sigmoid(self.model(torch.tensor([[float(len(trajectory))]]))).squeeze()


def get_reward(smiles, predictor):
    return predictor.predict(smiles) * 10


class Reinforcement:
    def __init__(self, generator, predictor, get_reward):
        self.generator, self.predictor, self.get_reward = generator, predictor, get_reward

    def policy_gradient(self, trajectories, n_batch=2, gamma=0.97):
        rl_loss = 0
        self.generator.optimizer.zero_grad()
        total_reward = 0
        for trajectory_input in trajectories[:n_batch]:
            reward = self.get_reward(trajectory_input.tolist(), self.predictor)
            discounted_reward = reward
            total_reward += reward
            hidden = self.generator.init_hidden()
            for p in range(len(trajectory_input) - 1):
                output, hidden = self.generator(trajectory_input[p], hidden)
                log_probs = F.log_softmax(output, dim=1)
                top_i = trajectory_input[p + 1]
                rl_loss -= (log_probs[0, top_i] * discounted_reward)
                discounted_reward = discounted_reward * gamma
        rl_loss = rl_loss / n_batch
        total_reward = total_reward / n_batch
        rl_loss.backward()
        self.generator.optimizer.step()
        return total_reward, rl_loss.item()


torch.manual_seed(0)
generator = StackAugmentedRNN()
RL = Reinforcement(generator, Predictor(), get_reward)
for _ in range(2):
    RL.policy_gradient([torch.tensor([0, 3, 2, 5]), torch.tensor([0, 1, 4, 5])])
