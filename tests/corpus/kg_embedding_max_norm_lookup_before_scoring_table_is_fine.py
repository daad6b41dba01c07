# The same knowledge-graph scorer with the two lines swapped, as the issue reports avoids the error:
# the batch lookup renormalizes the rows first, then the whole table is scored. Fine: the in-place
# renorm comes before the matmul saves the weight, and the gradients are those of the renormed table.
# expect: none
# outcome: ok
import torch
import torch.nn as nn


class EntityScorer(nn.Module):
    def __init__(self, n, d, m):
        super().__init__()
        self.entity = nn.Embedding(n, d, max_norm=True)
        self.W = nn.Parameter(torch.randn(m, d))

    def forward(self, idx):
        b = self.entity(idx) @ self.W.t()
        a = self.entity.weight @ self.W.t()
        return a.unsqueeze(0) + b.unsqueeze(1)


def train_step(model, optimizer, idx):
    optimizer.zero_grad()
    out = model(idx)
    loss = out.sigmoid().prod()
    loss.backward()
    optimizer.step()


torch.manual_seed(0)
n, d, m = 3, 5, 7
model = EntityScorer(n, d, m)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
train_step(model, optimizer, torch.tensor([1, 2]))
