# A Net runs its linear layer's output through a custom autograd Function that doubles its input in
# place and returns it (no mark_dirty), then scales the result with `logits *= self.s`. The Function
# handed back its input as-is, so its output is a view PyTorch made inside the Function, and the
# in-place scale on it is refused.
# expect: view-inplace
# outcome: raises RuntimeError
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
    return CustomOp.apply(x)  # @saved


class Net(nn.Module):
    def __init__(self, in_channel, out_channel, scale=400.0):
        super().__init__()
        self.fc = nn.Linear(in_channel, out_channel)
        self.s = scale

    def forward(self, input):
        x = self.fc(input)
        logits = custom_op(x)  # @saved
        logits *= self.s  # @culprit
        return logits


torch.manual_seed(0)
bs, in_channel, out_channel = 4, 6, 5
dummy_x = torch.rand(bs, in_channel)
net = Net(in_channel, out_channel)
x = net(dummy_x)
x.mean().backward()
