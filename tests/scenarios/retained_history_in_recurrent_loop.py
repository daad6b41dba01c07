# The usual wrong fix for "Trying to backward through the graph a second time": the hidden
# state is carried from step to step and every backward keeps the graph. Nothing raises, but
# each backward runs through every earlier step again (gradient accumulation over a sequence,
# no optimizer step in between), so each step is slower than the last and memory grows.
# expect: accumulated-graph tensor=h
# outcome: ok
import torch
from torch import nn


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(3, 6)
        self.out = nn.Linear(6, 2)

    def step(self, x, h):
        h = self.cell(x, h)  # @culprit
        return self.out(h), h


def accumulate_over_sequence(model, xs, ys):
    h = torch.zeros(1, 6)
    for x, y in zip(xs, ys):
        logits, h = model.step(x, h)
        loss = nn.functional.cross_entropy(logits, y)
        loss.backward(retain_graph=True)
    return h


torch.manual_seed(0)
model = Tagger()
xs = [torch.randn(1, 3) for _ in range(5)]
ys = [torch.randint(0, 2, (1,)) for _ in range(5)]
accumulate_over_sequence(model, xs, ys)
