# The binarizer of an RNN image-compression model applies a custom Sign Function with a second
# argument, is_training; its backward returns only grad_output (a straight-through estimator)
# and no None for that argument, so autograd finds one gradient where the forward took two inputs.
# expect: invalid-gradient
# outcome: raises RuntimeError
import torch
from torch import nn
from torch.autograd import Function


class Sign(Function):
    @staticmethod
    def forward(ctx, input, is_training=True):
        if is_training:
            prob = input.new(input.size()).uniform_()
            x = input.clone()
            x[(1 - input) / 2 <= prob] = 1
            x[(1 - input) / 2 > prob] = -1
            return x
        return input.sign()

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


class Binarizer(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 2, kernel_size=1, bias=False)

    def forward(self, input):
        feat = self.conv(input)
        x = torch.tanh(feat)
        return Sign.apply(x, self.training)  # @culprit


class Codec(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Conv1d(3, 4, kernel_size=3, padding=1)
        self.binarizer = Binarizer()
        self.decoder = nn.Conv1d(2, 3, kernel_size=3, padding=1)

    def forward(self, x):
        return self.decoder(self.binarizer(self.encoder(x)))


torch.manual_seed(0)
codec = Codec()
optimizer = torch.optim.Adam(codec.parameters(), lr=5e-4)
batch = torch.randn(2, 3, 8)
loss = (codec(batch) - batch).abs().mean()
optimizer.zero_grad()
loss.backward()  # @saved
optimizer.step()
