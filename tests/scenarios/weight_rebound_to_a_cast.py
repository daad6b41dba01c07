# A hand-written regression from an old tutorial: the weights are made as float64 leaves, then the
# name is rebound to a float32 cast to match the data. `w1` is no longer the leaf: its .grad stays
# None (PyTorch only warns), so the update below never runs.
# expect: missing-grad tensor=w1
# outcome: ok
import torch

torch.manual_seed(0)
x, y = torch.randn(16, 3), torch.randn(16, 1)
w1 = torch.randn(3, 1, dtype=torch.float64, requires_grad=True)
w1 = w1.type(torch.float)  # @culprit
for epoch in range(3):
    loss = ((x @ w1 - y) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        if w1.grad is not None:
            w1 -= 0.1 * w1.grad
            w1.grad.zero_()
