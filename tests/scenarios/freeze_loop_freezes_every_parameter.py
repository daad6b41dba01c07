# Fine-tuning in a function: the helper meant to freeze the backbone loops over every parameter
# of the model, through the requires_grad setter. Nothing the loss comes from can be trained, so
# backward raises; the line to blame is the setter, not the forward. The model is built inside
# the function and gone when it returns.
# expect: graph-cut tensor=loss
# outcome: raises RuntimeError
import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.backbone(x))


def freeze_backbone(model):
    for p in model.parameters():  # meant: model.backbone.parameters()
        p.requires_grad = False  # @culprit


def finetune(steps):
    model = Classifier()
    freeze_backbone(model)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad] or model.parameters(), lr=0.1)
    for _ in range(steps):
        x, y = torch.randn(5, 4), torch.tensor([0, 1, 1, 0, 1])
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


torch.manual_seed(0)
finetune(2)
