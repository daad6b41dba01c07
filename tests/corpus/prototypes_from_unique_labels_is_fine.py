# The prototypical-network loss: torch.unique over the integer labels of an episode finds its
# classes, and each prototype is the mean of its support embeddings. unique has no derivative,
# but nothing flows through it (its input is an integer tensor). Nothing to report.
# expect: none
# outcome: ok
import torch
from torch import nn
from torch.nn import functional as F


def euclidean_dist(x, y):
    n, m, d = x.size(0), y.size(0), x.size(1)
    x = x.unsqueeze(1).expand(n, m, d)
    y = y.unsqueeze(0).expand(n, m, d)
    return torch.pow(x - y, 2).sum(2)


def prototypical_loss(input, target, n_support):
    classes = torch.unique(target)
    n_classes = len(classes)
    n_query = target.eq(classes[0].item()).sum().item() - n_support
    support_idxs = [target.eq(c).nonzero()[:n_support].squeeze(1) for c in classes]
    prototypes = torch.stack([input[idx_list].mean(0) for idx_list in support_idxs])
    query_idxs = torch.stack([target.eq(c).nonzero()[n_support:] for c in classes]).view(-1)
    query_samples = input[query_idxs]
    dists = euclidean_dist(query_samples, prototypes)
    log_p_y = F.log_softmax(-dists, dim=1).view(n_classes, n_query, -1)
    target_inds = torch.arange(0, n_classes).view(n_classes, 1, 1).expand(n_classes, n_query, 1).long()
    loss_val = -log_p_y.gather(2, target_inds).squeeze().view(-1).mean()
    _, y_hat = log_p_y.max(2)
    acc_val = y_hat.eq(target_inds.squeeze(2)).float().mean()
    return loss_val, acc_val


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))
optim = torch.optim.Adam(model.parameters(), lr=1e-3)
for episode in range(2):
    x = torch.randn(12, 6)
    y = torch.tensor([3, 3, 3, 3, 7, 7, 7, 7, 1, 1, 1, 1])
    loss, acc = prototypical_loss(model(x), target=y, n_support=2)
    optim.zero_grad()
    loss.backward()
    optim.step()
