# The same BinaryNet derivative's BinarizeLinear: forward keeps `temp = self.weight.data`, assigns
# `self.weight.data = Binarize(temp)`, runs the linear and assigns `temp` back before returning. The
# linear saved `weight.t()`, a view that keeps the binarized storage the assignment replaced, so the
# input gradient uses sign(w) as the forward did. Fine: no error, gradients as with copies.
# expect: none
# outcome: ok
import torch
from torch import nn


def Binarize(tensor):
    return tensor.sign()


class BinarizeLinear(nn.Linear):
    def forward(self, input):
        input.data = Binarize(input.data)
        temp = self.weight.data
        self.weight.data = Binarize(temp)
        out = nn.functional.linear(input, self.weight, None)
        self.weight.data = temp
        return out


class BinaryMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc0 = nn.Linear(6, 5)
        self.htanh0 = nn.Hardtanh()
        self.fc1 = BinarizeLinear(5, 5, bias=False)
        self.bn1 = nn.BatchNorm1d(5)
        self.htanh1 = nn.Hardtanh()
        self.fc2 = BinarizeLinear(5, 3, bias=False)

    def forward(self, x):
        x = self.htanh0(self.fc0(x))
        x = self.htanh1(self.bn1(self.fc1(x)))
        return self.fc2(x)


def train(model, optimizer):
    model.train()
    data, target = torch.randn(4, 6), torch.tensor([0, 1, 2, 0])
    output = model(data)
    loss = nn.CrossEntropyLoss()(output, target)
    optimizer.zero_grad()
    loss.backward()


torch.manual_seed(0)
model = BinaryMLP()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
train(model, optimizer)
