# A BinaryNet derivative's BinarizeConv2d: forward keeps `temp = self.weight.data`, assigns
# `self.weight.data = Binarize(temp)`, runs conv2d and assigns `self.weight.data = temp` back before
# returning. conv2d saved the weight itself for the input gradient, so backward multiplies by the
# real-valued weight instead of the sign(w) the forward used: earlier layers get wrong gradients.
# expect: silent-data-mutation
# outcome: wrong-grad
import torch
from torch import nn


def Binarize(tensor):
    return tensor.sign()


class BinarizeConv2d(nn.Conv2d):
    def forward(self, input):
        if input.size(1) != 3:
            input.data = Binarize(input.data)
        temp = self.weight.data
        self.weight.data = Binarize(temp)
        out = nn.functional.conv2d(input, self.weight, None, self.stride,  # @saved
                                   self.padding, self.dilation, self.groups)
        self.weight.data = temp  # @culprit
        return out


class BinaryCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = BinarizeConv2d(3, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.htanh1 = nn.Hardtanh()
        self.conv2 = BinarizeConv2d(4, 4, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        x = self.htanh1(self.bn1(self.conv1(x)))
        x = self.bn2(self.conv2(x))
        return self.fc(x.mean((2, 3)))


def train(model, optimizer):
    model.train()
    data, target = torch.randn(2, 3, 5, 5), torch.tensor([0, 1])
    output = model(data)
    loss = nn.CrossEntropyLoss()(output, target)
    optimizer.zero_grad()
    loss.backward()


torch.manual_seed(0)
model = BinaryCNN()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
train(model, optimizer)
