# A positional table computed once in __init__ from a parameter (through a projection), then
# added by every forward: the second step's backward runs into the graph the first one freed.
# expect: graph-freed tensor=self.pe
# outcome: raises RuntimeError
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self, n=5, d=4):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(n, 2))
        self.proj = nn.Linear(2, d)
        self.pe = torch.tanh(self.proj(self.pos))
        self.fc = nn.Linear(d, 1)

    def forward(self, x):
        return self.fc(x + self.pe).mean(1)  # @culprit


def train(enc, steps):
    opt = torch.optim.SGD(enc.parameters(), lr=0.1)
    for _ in range(steps):
        x, y = torch.randn(3, 5, 4), torch.randn(3, 1)
        loss = (enc(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()  # @saved
        opt.step()


torch.manual_seed(0)
train(Encoder(), 2)
