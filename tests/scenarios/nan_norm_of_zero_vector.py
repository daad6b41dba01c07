# Normalising embeddings by a hand-written norm: one embedding is all zeros, and the derivative
# of `s ** 0.5` at s = 0 is infinite. (torch's own .norm() masks that case; `** 0.5` does not.)
# expect: nan-gradient
# outcome: ok
# capture: check_nan=True
import torch


def normalise(v):
    norm = (v ** 2).sum(-1, keepdim=True) ** 0.5  # @culprit
    return v / (norm + 1e-6)


torch.manual_seed(0)
emb = torch.randn(4, 3)
emb[2] = 0
emb.requires_grad_()
loss = normalise(emb).sum()
loss.backward()
