# The same Net with the out-of-place scale the report has commented out, `logits = logits * self.s`:
# the custom Function still doubles its input in place, but nothing writes the view it returns, and
# its backward runs. Fine: gradients equal those of `2 * s * fc(x)`.
# expect: none
# outcome: ok
import torch
import torch.nn as nn


class CustomOp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x *= 2.0
        return x

    @staticmethod
    def backward(ctx, grad_output):
        grad_output *= 2.0
        return grad_output


def custom_op(x):
    return CustomOp.apply(x)


class Net(nn.Module):
    def __init__(self, in_channel, out_channel, scale=400.0):
        super().__init__()
        self.fc = nn.Linear(in_channel, out_channel)
        self.s = scale

    def forward(self, input):
        x = self.fc(input)
        logits = custom_op(x)
        logits = logits * self.s
        return logits


torch.manual_seed(0)
bs, in_channel, out_channel = 4, 6, 5
dummy_x = torch.rand(bs, in_channel)
net = Net(in_channel, out_channel)
x = net(dummy_x)
x.mean().backward()
