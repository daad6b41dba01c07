# A GCN with a trainable adjacency mask is pruned every few epochs: the pruning method builds
# the new 0/1 mask and assigns it as a fresh nn.Parameter. The optimizer still holds the old
# parameter, which no longer takes part in the forward: after the first prune it gets no
# gradient and the mask the model uses is never updated.
# expect: missing-grad
# outcome: ok
import torch
from torch import nn


class SimpleModel(nn.Module):
    def __init__(self, adj_mat):
        super().__init__()
        self.adj_mat = adj_mat
        self.adj_mask_train = nn.Parameter(torch.ones_like(adj_mat))
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        adj = self.adj_mat * self.adj_mask_train
        return self.lin(adj @ x)

    def update_norm_adj(self, prune_percent=0.25):
        with torch.no_grad():
            mask = self.adj_mask_train.flatten()
            adj_thre = mask[mask != 0].abs().quantile(prune_percent)
            ones = torch.ones_like(self.adj_mask_train)
            zeros = torch.zeros_like(self.adj_mask_train)
            adj_mask = torch.where(self.adj_mask_train.abs() >= adj_thre, ones, zeros)
        self.adj_mask_train = nn.Parameter(adj_mask, requires_grad=True)  # @culprit


def train(model, x, y, epochs=4, prune_every=2):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(1, epochs + 1):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if epoch % prune_every == 0:
            model.update_norm_adj()


torch.manual_seed(0)
model = SimpleModel((torch.rand(4, 4) > 0.3).float())
train(model, torch.randn(4, 3), torch.randn(4, 2))
