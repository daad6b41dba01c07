# A GRU language-model loop in a function carries the hidden state across batches without
# detaching it: the second batch's backward runs into the first batch's freed graph. The first
# op that uses the carried state is in the model's forward.
# expect: graph-freed tensor=hidden
# outcome: raises RuntimeError
import torch
from torch import nn


class CharModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(5, 7)
        self.out = nn.Linear(7, 5)

    def forward(self, x, hidden):
        hidden = self.cell(x, hidden)  # @culprit
        return self.out(hidden), hidden


def train(model, opt, batches):
    hidden = torch.zeros(2, 7)
    for x, y in batches:
        logits, hidden = model(x, hidden)
        loss = nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()  # @saved
        opt.step()


torch.manual_seed(0)
model = CharModel()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
train(model, opt, [(torch.randn(2, 5), torch.tensor([1, 3])) for _ in range(3)])
