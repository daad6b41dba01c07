# facebookresearch/simsiam's SimSiam builder and main_simsiam.py loop: the model returns
# `p1, p2, z1.detach(), z2.detach()` and the loss is the symmetrized negative cosine of each
# prediction with the other view's detached projection, the stop-gradient the method is built on.
# One optimizer over encoder and predictor; an MLP encoder on 6-dim "images".
# expect: none
# outcome: ok
import torch
from torch import nn


class SimSiam(nn.Module):
    def __init__(self, dim=8, pred_dim=4):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(6, dim), nn.BatchNorm1d(dim), nn.ReLU(), nn.Linear(dim, dim),
                                     nn.BatchNorm1d(dim, affine=False))
        self.predictor = nn.Sequential(nn.Linear(dim, pred_dim, bias=False), nn.BatchNorm1d(pred_dim),
                                       nn.ReLU(inplace=True), nn.Linear(pred_dim, dim))

    def forward(self, x1, x2):
        z1 = self.encoder(x1)
        z2 = self.encoder(x2)
        p1 = self.predictor(z1)
        p2 = self.predictor(z2)
        return p1, p2, z1.detach(), z2.detach()


def train(train_loader, model, criterion, optimizer):
    model.train()
    for i, images in enumerate(train_loader):
        p1, p2, z1, z2 = model(x1=images[0], x2=images[1])
        loss = -(criterion(p1, z2).mean() + criterion(p2, z1).mean()) * 0.5
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


torch.manual_seed(0)
model = SimSiam()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
x = torch.randn(4, 6)
train([(x + 0.1 * torch.randn(4, 6), x + 0.1 * torch.randn(4, 6)) for _ in range(2)], model,
      nn.CosineSimilarity(dim=1), optimizer)
