# torch.autograd.grad for two inputs, one of which the output does not depend on: PyTorch names
# only "index 1".
# expect: missing-grad tensor=bias
# outcome: raises RuntimeError
import torch

torch.manual_seed(0)
scale = torch.randn(3, requires_grad=True)
bias = torch.randn(3, requires_grad=True)
out = (scale * torch.randn(3)).sum()
grads = torch.autograd.grad(out, [scale, bias])  # @culprit
