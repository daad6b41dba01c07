# RA-CNN's trainer backpropagates a pairwise rank loss between the scores of consecutive scales,
# one backward per pair. The rank loss returns one hinge value per sample; with batch_size=1 that
# is a single element and backward accepts it, with batch_size=4 backward refuses it.
# expect: nonscalar-backward
# outcome: raises RuntimeError
import torch
from torch import nn
from torch.nn import functional as F


class RankLoss(nn.Module):
    def __init__(self, margin=0.05):
        super().__init__()
        self.margin = margin

    def forward(self, scores1, scores2, target):
        ps1 = F.softmax(scores1, dim=1).gather(1, target.view(-1, 1))
        ps2 = F.softmax(scores2, dim=1).gather(1, target.view(-1, 1))
        return torch.clamp(ps1 - ps2 + self.margin, min=0)  # @culprit


class RACNN(nn.Module):
    def __init__(self, n_in=6, n_class=4, n_scales=3):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(n_in, 8), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(8, n_class) for _ in range(n_scales)])

    def forward(self, x):
        h = self.trunk(x)
        return [head(h * (i + 1)) for i, head in enumerate(self.heads)]


class Manager:
    def __init__(self, model):
        self.model = model
        self.criterion_rank = RankLoss()

    def do_batch(self, optimizer, batch, label):
        optimizer.zero_grad()
        scores = self.model(batch)
        for i in range(1, len(scores)):
            retain_graph = i < len(scores) - 1
            self.criterion_rank(scores[i - 1], scores[i], label).backward(retain_graph=retain_graph)  # @saved
        optimizer.step()


torch.manual_seed(0)
model = RACNN()
manager = Manager(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
manager.do_batch(optimizer, torch.randn(4, 6), torch.randint(0, 4, (4,)))
