# The bubbliiiing/yolo3-pytorch#110 change done so that it runs with Freeze_Train: the meta-gradient
# is taken only over the parameters that require grad (those the optimizer holds). Nothing to
# report.
# expect: none
# outcome: ok
import torch
from torch import nn


class YoloBody(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.LeakyReLU(0.1))
        self.head = nn.Conv2d(4, 6, 1)

    def forward(self, x):
        return self.head(self.backbone(x))


def fit_one_epoch(model_train, optimizer, gen):
    trainable = [p for p in model_train.parameters() if p.requires_grad]
    for images, targets in gen:
        optimizer.zero_grad()
        loss_value = ((model_train(images) - targets) ** 2).mean()
        grad = torch.autograd.grad(loss_value, trainable, retain_graph=True)
        loss_value.backward()
        optimizer.step()


torch.manual_seed(0)
model = YoloBody()
for param in model.backbone.parameters():
    param.requires_grad = False
optimizer = torch.optim.Adam(filter(lambda p: p.requires_grad, model.parameters()), lr=1e-3)
fit_one_epoch(model, optimizer, [(torch.randn(2, 3, 4, 4), torch.randn(2, 6, 4, 4))])
