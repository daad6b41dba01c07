# segmentation_models.pytorch's Dice loss given a `threshold`: the helper binarises the
# prediction, which cuts it off the model, and the "fix" proposed for the resulting error wraps
# the result in torch.tensor(..., requires_grad=True). Backward now runs and trains nothing.
# expect: graph-cut tensor=loss
# outcome: ok
import torch
from torch import nn


def _threshold(x, threshold=None):
    if threshold is not None:
        return torch.tensor((x > threshold).type(x.dtype), requires_grad=True)  # @culprit
    return x


def f_score(pr, gt, beta=1, eps=1e-7, threshold=None):
    pr = _threshold(pr, threshold=threshold)
    tp = torch.sum(gt * pr)
    fp = torch.sum(pr) - tp
    fn = torch.sum(gt) - tp
    return ((1 + beta ** 2) * tp + eps) / ((1 + beta ** 2) * tp + beta ** 2 * fn + fp + eps)


class DiceLoss(nn.Module):
    def __init__(self, eps=1.0, beta=1.0, threshold=None):
        super().__init__()
        self.eps, self.beta, self.threshold = eps, beta, threshold

    def forward(self, y_pr, y_gt):
        y_pr = torch.sigmoid(y_pr)
        return 1 - f_score(y_pr, y_gt, beta=self.beta, eps=self.eps, threshold=self.threshold)


def train_epoch(model, loader, criterion, optimizer):
    for image, mask in loader:
        optimizer.zero_grad()
        loss = criterion(model(image), mask)
        loss.backward()
        optimizer.step()


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
criterion = DiceLoss(threshold=0.5)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loader = [(torch.randn(4, 8), (torch.rand(4, 8) > 0.5).float()) for _ in range(2)]
train_epoch(model, loader, criterion, optimizer)
