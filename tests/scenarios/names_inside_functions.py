# Everything happens inside a function, with a model the function made: the parameter is named
# by its dotted path, never by an operand of the line that used it (`self.emb(ids)`).
# expect: silent-data-mutation tensor=model.head.weight
# outcome: wrong-grad
import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 20)

    def forward(self, ids):
        h = self.emb(ids)
        return self.head(h.relu())  # @saved


def train_step():
    torch.manual_seed(0)
    model = TinyLM()
    ids = torch.randint(0, 20, (2, 5))
    loss = model(ids).logsumexp(-1).mean()
    model.head.weight.data.mul_(0.5)  # @culprit
    loss.backward()
    return model


model = train_step()
