# Debugging a NaN under torch.autograd.detect_anomaly(): backward raises "Function 'SqrtBackward0'
# returned nan values in its 0th output", naming a node, not the line. The line is the forward's sqrt.
# expect: backward-error
# outcome: raises RuntimeError
import torch
from torch import nn


class PairwiseDistance(nn.Module):
    def forward(self, points):
        diff = points[:, None, :] - points[None, :, :]
        return (diff ** 2).sum(-1).sqrt()  # @culprit


def spread_loss(points):
    with torch.autograd.detect_anomaly():
        dist = PairwiseDistance()(points)
        loss = -dist.mean()
        loss.backward()  # @saved
    return loss


torch.manual_seed(0)
points = torch.randn(4, 2, requires_grad=True)
spread_loss(points)
