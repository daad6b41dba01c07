# bubbliiiing/yolo3-pytorch trains with Freeze_Train: the backbone's parameters get
# requires_grad = False for the first epochs. A meta-learning change to utils_fit.py then asks
# torch.autograd.grad for the gradient of the loss with respect to every parameter of the model,
# the frozen ones included, and autograd.grad refuses a tensor that does not require grad.
# expect: needs-grad tensor=model.backbone.0.weight
# outcome: raises RuntimeError
import torch
from torch import nn


class YoloBody(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.LeakyReLU(0.1))
        self.head = nn.Conv2d(4, 6, 1)

    def forward(self, x):
        return self.head(self.backbone(x))


def yolo_loss(outputs, targets):
    return ((outputs - targets) ** 2).mean()


def fit_one_epoch(model_train, optimizer, gen):
    for images, targets in gen:
        optimizer.zero_grad()
        outputs = model_train(images)
        loss_value = yolo_loss(outputs, targets)
        grad = torch.autograd.grad(loss_value, model_train.parameters(), retain_graph=True)  # @saved
        loss_value.backward()
        optimizer.step()


torch.manual_seed(0)
model = YoloBody()
Freeze_Train = True
if Freeze_Train:
    for param in model.backbone.parameters():
        param.requires_grad = False  # @culprit
optimizer = torch.optim.Adam(filter(lambda p: p.requires_grad, model.parameters()), lr=1e-3)
gen = [(torch.randn(2, 3, 4, 4), torch.randn(2, 6, 4, 4))]
fit_one_epoch(model, optimizer, gen)
