# A "stateful" RNN module keeps its hidden state in an attribute between forward calls and never
# detaches it: the second step's backward runs into the first step's freed graph. The state has
# no variable name anywhere; the line that carries it calls it `self.hidden`.
# expect: graph-freed tensor=self.hidden
# outcome: raises RuntimeError
import torch
from torch import nn


class StatefulRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(3, 6, batch_first=True)
        self.fc = nn.Linear(6, 1)
        self.hidden = None

    def forward(self, x):
        out, self.hidden = self.rnn(x, self.hidden)  # @culprit
        return self.fc(out[:, -1])


def train(model, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        x, y = torch.randn(2, 4, 3), torch.randn(2, 1)
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()  # @saved
        opt.step()


torch.manual_seed(0)
train(StatefulRNN(), 3)
