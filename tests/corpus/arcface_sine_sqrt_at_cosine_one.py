# arcface-pytorch's ArcMarginProduct computes sine = sqrt((1 - cosine^2).clamp(0, 1)). The class
# weights were imprinted from the embeddings of a first batch, so one sample's cosine to its own
# class is exactly 1: the forward is finite, and the derivative of sqrt at 0 turns the gradients
# of the backbone and of the margin weights into NaN.
# expect: nan-gradient
# outcome: ok
# capture: check_nan=True
import math

import torch
from torch import nn
from torch.nn import functional as F


class ArcMarginProduct(nn.Module):
    def __init__(self, in_features, out_features, s=30.0, m=0.50, easy_margin=False):
        super().__init__()
        self.s, self.m, self.easy_margin = s, m, easy_margin
        self.weight = nn.Parameter(torch.FloatTensor(out_features, in_features))
        nn.init.xavier_uniform_(self.weight)
        self.cos_m, self.sin_m = math.cos(m), math.sin(m)
        self.th = math.cos(math.pi - m)
        self.mm = math.sin(math.pi - m) * m

    def forward(self, input, label):
        cosine = F.linear(F.normalize(input), F.normalize(self.weight))
        sine = torch.sqrt((1.0 - torch.pow(cosine, 2)).clamp(0, 1))  # @culprit
        phi = cosine * self.cos_m - sine * self.sin_m
        if self.easy_margin:
            phi = torch.where(cosine > 0, phi, cosine)
        else:
            phi = torch.where(cosine > self.th, phi, cosine - self.mm)
        one_hot = torch.zeros(cosine.size())
        one_hot.scatter_(1, label.view(-1, 1).long(), 1)
        output = (one_hot * phi) + ((1.0 - one_hot) * cosine)
        output *= self.s
        return output


def imprint(backbone, metric_fc, images, labels):
    with torch.no_grad():
        embeddings = F.normalize(backbone(images))
        for c in labels.unique():
            metric_fc.weight[c] = F.normalize(embeddings[labels == c][0], dim=0)


torch.manual_seed(0)
backbone = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
metric_fc = ArcMarginProduct(4, 3)
optimizer = torch.optim.SGD([*backbone.parameters(), *metric_fc.parameters()], lr=0.1)
images, labels = torch.randn(5, 6), torch.tensor([0, 1, 2, 1, 0])
imprint(backbone, metric_fc, images, labels)
output = metric_fc(backbone(images), labels)
loss = F.cross_entropy(output, labels)
optimizer.zero_grad()
loss.backward()
