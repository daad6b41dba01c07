# A hand-written autograd.Function adds a bias that broadcasts over the batch, and its backward
# reduces the bias gradient over the wrong dimension: "Function AddBiasBackward returned an invalid
# gradient at index 1 - got [4] but expected shape compatible with [3]".
# expect: invalid-gradient tensor=layer.bias
# outcome: raises RuntimeError
import torch
from torch import nn


class AddBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias):
        return x + bias

    @staticmethod
    def backward(ctx, grad):
        return grad, grad.sum(1)


class BiasedLinear(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.linear = nn.Linear(n_in, n_out, bias=False)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return AddBias.apply(self.linear(x), self.bias)  # @culprit


torch.manual_seed(0)
layer = BiasedLinear(2, 3)
layer(torch.randn(4, 2)).pow(2).sum().backward()  # @saved
