# reid-strong-baseline's batch-hard triplet loss: the pairwise distance matrix is built with an
# in-place addmm_ and clamped to 1e-12 before the sqrt, so the zero distances of each embedding
# to itself give finite gradients. Every gradient is finite: nothing to report.
# expect: none
# outcome: ok
# capture: check_nan=True
import torch
from torch import nn


def euclidean_dist(x, y):
    m, n = x.size(0), y.size(0)
    xx = torch.pow(x, 2).sum(1, keepdim=True).expand(m, n)
    yy = torch.pow(y, 2).sum(1, keepdim=True).expand(n, m).t()
    dist = xx + yy
    dist.addmm_(x, y.t(), beta=1, alpha=-2)
    dist = dist.clamp(min=1e-12).sqrt()  # for numerical stability
    return dist


def hard_example_mining(dist_mat, labels):
    N = dist_mat.size(0)
    is_pos = labels.expand(N, N).eq(labels.expand(N, N).t())
    is_neg = labels.expand(N, N).ne(labels.expand(N, N).t())
    dist_ap, _ = torch.max(dist_mat[is_pos].contiguous().view(N, -1), 1, keepdim=True)
    dist_an, _ = torch.min(dist_mat[is_neg].contiguous().view(N, -1), 1, keepdim=True)
    return dist_ap.squeeze(1), dist_an.squeeze(1)


class TripletLoss(object):
    def __init__(self, margin=None):
        self.margin = margin
        self.ranking_loss = nn.MarginRankingLoss(margin=margin) if margin is not None else nn.SoftMarginLoss()

    def __call__(self, global_feat, labels):
        dist_mat = euclidean_dist(global_feat, global_feat)
        dist_ap, dist_an = hard_example_mining(dist_mat, labels)
        y = dist_an.new().resize_as_(dist_an).fill_(1)
        if self.margin is not None:
            loss = self.ranking_loss(dist_an, dist_ap, y)
        else:
            loss = self.ranking_loss(dist_an - dist_ap, y)
        return loss, dist_ap, dist_an


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 6))
triplet = TripletLoss(margin=0.3)
optimizer = torch.optim.Adam(model.parameters(), lr=3.5e-4)
for _ in range(2):
    images, pids = torch.randn(6, 10), torch.tensor([0, 0, 1, 1, 2, 2])
    loss, _, _ = triplet(model(images), pids)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
