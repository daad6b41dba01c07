# A knowledge-graph scorer keeps its entity table in `nn.Embedding(n, d, max_norm=True)` and scores
# the whole table (`self.entity.weight @ self.W.t()`) before looking up the batch's entities. The
# lookup renormalizes the looked-up rows of the weight in place, which the first matmul saved for
# W's gradient, so the backward fails (pytorch issue 26596: swapping the two lines avoids it).
# expect: saved-tensor-modified tensor=model.entity.weight
# outcome: raises RuntimeError
import torch
import torch.nn as nn


class EntityScorer(nn.Module):
    def __init__(self, n, d, m):
        super().__init__()
        self.entity = nn.Embedding(n, d, max_norm=True)
        self.W = nn.Parameter(torch.randn(m, d))

    def forward(self, idx):
        a = self.entity.weight @ self.W.t()  # @saved
        b = self.entity(idx) @ self.W.t()  # @culprit
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
