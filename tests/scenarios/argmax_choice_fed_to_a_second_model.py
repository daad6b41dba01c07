# A hard-attention model: a scorer picks one slot per example with torch.max(..., 1)[1] and an
# embedding of the chosen slot feeds the loss. The indices carry no gradient: the scorer, which the
# optimizer holds, never gets one, and nothing raises.
# expect: missing-grad tensor=model.scorer.weight
# outcome: ok
import torch
from torch import nn


class HardSelect(nn.Module):
    def __init__(self, dim=6, slots=4):
        super().__init__()
        self.scorer = nn.Linear(dim, slots)
        self.slots = nn.Embedding(slots, dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        _, chosen = torch.max(self.scorer(x), 1)  # @culprit
        return self.head(self.slots(chosen) + x)


torch.manual_seed(0)
model = HardSelect()
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for step in range(3):
    x, y = torch.randn(5, 6), torch.randn(5, 1)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
