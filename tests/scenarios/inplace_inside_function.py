# The bug inside a helper function: names come from the helper's locals.
# expect: saved-tensor-modified tensor=hidden
# outcome: raises RuntimeError
import torch


def forward(x, w):
    hidden = torch.exp(x @ w)  # @saved
    hidden /= hidden.sum()  # @culprit
    return hidden.sum()


x = torch.randn(3, 4)
w = torch.randn(4, 2, requires_grad=True)
loss = forward(x, w)
loss.backward()
