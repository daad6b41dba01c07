# A custom autograd Function saves its input with ctx.save_for_backward.
# expect: saved-tensor-modified tensor=h
# outcome: raises RuntimeError
import torch


class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 3 * x ** 2 * grad


a = torch.randn(5, requires_grad=True)
h = a * 2
y = Cube.apply(h)  # @saved
h.zero_()  # @culprit
y.sum().backward()
