# A weight made with requires_grad=True and then moved to float64 inside a setup function: the
# caller trains the moved copy, which is not a leaf, so its .grad stays None.
# expect: missing-grad tensor=w
# outcome: ok
import torch


def make_weight(n):
    w = torch.zeros(n, requires_grad=True).to(torch.float64)  # @culprit
    return w


torch.manual_seed(0)
w = make_weight(3)
x = torch.randn(5, 3, dtype=torch.float64)
loss = (x @ w - 1).pow(2).mean()
loss.backward()
