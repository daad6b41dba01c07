# A preallocated state buffer: writing h[t] bumps the version counter shared by every view of h,
# so the h[t - 1] saved by the matmul of the previous step is "modified" too.
# expect: saved-tensor-modified tensor=h
# outcome: raises RuntimeError
import torch

torch.manual_seed(0)
W = torch.randn(3, 3, requires_grad=True)
x = torch.randn(5, 3)
h = torch.zeros(6, 3)
for t in range(5):
    h[t + 1] = torch.tanh(x[t] + h[t] @ W)  # @culprit @saved
h[-1].sum().backward()
