# kornia's binary_focal_loss_with_logits (0.5) used with gamma=0.5 in a small segmentation model.
# One pixel's logit is so large that sigmoid rounds to exactly 1.0: the loss stays finite, but the
# derivative of (1 - p) ** 0.5 at 0 is infinite and, times the zero it is multiplied by, every
# gradient of the head turns NaN.
# expect: nan-gradient
# outcome: ok
# capture: check_nan=True
import torch
from torch import nn


def binary_focal_loss_with_logits(input, target, alpha=0.25, gamma=2.0, reduction="none", eps=1e-8):
    probs = torch.sigmoid(input)
    loss_tmp = (-alpha * torch.pow((1.0 - probs), gamma) * target * torch.log(probs + eps)  # @culprit
                - (1 - alpha) * torch.pow(probs, gamma) * (1.0 - target) * torch.log(1.0 - probs + eps))
    if reduction == "mean":
        return torch.mean(loss_tmp)
    return loss_tmp


class BinaryFocalLossWithLogits(nn.Module):
    def __init__(self, alpha, gamma=2.0, reduction="none"):
        super().__init__()
        self.alpha, self.gamma, self.reduction = alpha, gamma, reduction

    def forward(self, input, target):
        return binary_focal_loss_with_logits(input, target, self.alpha, self.gamma, self.reduction)


class SegHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 1, 1)
        with torch.no_grad():
            self.conv.weight.fill_(1.0)
            self.conv.bias.zero_()

    def forward(self, x):
        return self.conv(x)


def train_step(model, criterion, opt, image, mask):
    opt.zero_grad()
    loss = criterion(model(image), mask)
    loss.backward()
    opt.step()
    return loss.item()


torch.manual_seed(0)
model = SegHead()
criterion = BinaryFocalLossWithLogits(alpha=0.5, gamma=0.5, reduction="mean")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
image = 0.1 * torch.randn(1, 2, 3, 3)
image[0, :, 1, 1] = 40.0  # a very confident foreground pixel
mask = torch.zeros(1, 1, 3, 3)
mask[0, 0, 1, 1] = 1.0
train_step(model, criterion, opt, image, mask)
