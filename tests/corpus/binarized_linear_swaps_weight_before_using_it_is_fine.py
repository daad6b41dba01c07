# BinaryNet's BinarizeLinear as published: the forward assigns `input.data = Binarize(input.data)`
# and `self.weight.data = Binarize(self.weight.org)` before the linear uses them, and the training
# loop copies the real-valued weights back into `p.data` only after `loss.backward()`. Every swap
# precedes the save or follows the backward. Fine: trains without error.
# expect: none
# outcome: ok
import torch
from torch import nn


def Binarize(tensor):
    return tensor.sign()


class BinarizeLinear(nn.Linear):
    def forward(self, input):
        if input.size(1) != 6:
            input.data = Binarize(input.data)
        if not hasattr(self.weight, "org"):
            self.weight.org = self.weight.data.clone()
        self.weight.data = Binarize(self.weight.org)
        out = nn.functional.linear(input, self.weight)
        if self.bias is not None:
            self.bias.org = self.bias.data.clone()
            out += self.bias.view(1, -1).expand_as(out)
        return out


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = BinarizeLinear(6, 5)
        self.bn1 = nn.BatchNorm1d(5)
        self.htanh1 = nn.Hardtanh()
        self.fc2 = BinarizeLinear(5, 3)

    def forward(self, x):
        return self.fc2(self.htanh1(self.bn1(self.fc1(x))))


def train(model, optimizer, steps=2):
    model.train()
    for _ in range(steps):
        data, target = torch.randn(4, 6), torch.tensor([0, 1, 2, 0])
        output = model(data)
        loss = nn.CrossEntropyLoss()(output, target)
        optimizer.zero_grad()
        loss.backward()
        for p in list(model.parameters()):
            if hasattr(p, "org"):
                p.data.copy_(p.org)
        optimizer.step()
        for p in list(model.parameters()):
            if hasattr(p, "org"):
                p.org.copy_(p.data.clamp_(-1, 1))


torch.manual_seed(0)
model = Net()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
train(model, optimizer)
