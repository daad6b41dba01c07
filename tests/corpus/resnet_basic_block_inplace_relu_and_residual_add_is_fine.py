# torchvision's BasicBlock: conv-bn-ReLU(inplace=True)-conv-bn, then `out += identity` and the in-place
# ReLU again. Each in-place op writes a tensor no node saved (BatchNorm saves its input, the add
# saves nothing), which is why the library ships it this way. Fine: trains without error.
# expect: none
# outcome: ok
import torch
from torch import nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class TinyResNet(nn.Module):
    def __init__(self, num_classes=3):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(inplace=True))
        self.layer1 = nn.Sequential(BasicBlock(4, 4), BasicBlock(4, 4))
        self.fc = nn.Linear(4, num_classes)

    def forward(self, x):
        x = self.layer1(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def train_one_epoch(model, criterion, optimizer):
    model.train()
    for _ in range(2):
        image, target = torch.randn(2, 3, 6, 6), torch.tensor([0, 2])
        output = model(image)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


torch.manual_seed(0)
model = TinyResNet()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
train_one_epoch(model, nn.CrossEntropyLoss(), optimizer)
