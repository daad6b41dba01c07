# RK-Net's USAM unit (a module that overrides `__call__`) turns a feature map into a spatial attention
# map through BatchNorm and ReLU and, with `polish=True`, zeroes the map's border in place. ReLU saved
# its output for backward, so the border writes make the training step's backward fail.
# expect: saved-tensor-modified tensor=att
# outcome: raises RuntimeError
import torch
import torch.nn.functional as F
from torch import nn


class USAM(nn.Module):
    def __init__(self, kernel_size=3, padding=1, polish=True):
        super().__init__()
        kernel = torch.ones((kernel_size, kernel_size)).unsqueeze(0).unsqueeze(0)
        self.weight = nn.Parameter(data=kernel, requires_grad=False)
        kernel2 = (torch.ones((1, 1)) * (kernel_size * kernel_size)).unsqueeze(0).unsqueeze(0)
        self.weight2 = nn.Parameter(data=kernel2, requires_grad=False)
        self.polish = polish
        self.pad = padding
        self.relu = nn.ReLU()
        self.bn = nn.BatchNorm2d(1)

    def __call__(self, x):
        fmap = x.sum(1, keepdim=True)
        x1 = F.conv2d(fmap, self.weight, padding=self.pad)
        x2 = F.conv2d(fmap, self.weight2, padding=0)
        att = x2 - x1
        att = self.bn(att)
        att = self.relu(att)  # @saved
        if self.polish:
            att[:, :, :, 0] = 0  # @culprit
            att[:, :, :, -1] = 0
            att[:, :, 0, :] = 0
            att[:, :, -1, :] = 0
        output = x + att * x
        return output


class RKNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.usam = USAM()
        self.classifier = nn.Linear(4, 2)

    def forward(self, x):
        x = self.usam(self.conv(x))
        return self.classifier(x.mean((2, 3)))


def train_one_epoch(model, optimizer, criterion):
    model.train()
    for _ in range(2):
        inputs, labels = torch.randn(2, 3, 6, 6), torch.tensor([0, 1])
        optimizer.zero_grad()
        loss = criterion(model(inputs), labels)
        loss.backward()
        optimizer.step()


torch.manual_seed(0)
model = RKNet()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
train_one_epoch(model, optimizer, nn.CrossEntropyLoss())
