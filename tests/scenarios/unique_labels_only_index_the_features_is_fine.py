# A centre loss that uses torch.unique on the labels (no gradient needed) only to pick the
# features of each class: the features stay on a differentiable path.
# expect: none
# outcome: ok
import torch
from torch import nn


class CenterLoss(nn.Module):
    def forward(self, feats, labels):
        loss = feats.new_zeros(())
        for c in torch.unique(labels):
            members = feats[labels == c]
            loss = loss + (members - members.mean(0)).pow(2).sum()
        return loss / feats.shape[0]


torch.manual_seed(0)
encoder = nn.Linear(4, 3)
CenterLoss()(encoder(torch.randn(8, 4)), torch.tensor([0, 1, 0, 2, 1, 0, 2, 2])).backward()
