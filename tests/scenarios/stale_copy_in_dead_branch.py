# Two saved tensors go stale, but only one is on backward's path: the other belongs to a branch
# that only feeds argsort (indices, no gradient). The diagnosis names the one PyTorch reports.
# expect: saved-tensor-modified tensor=x
# outcome: raises RuntimeError
import torch


def score(w, x, y):
    scores = torch.einsum("ij,j->i", y, w)
    ranking = scores.argsort()
    out = torch.mv(x, w)  # @saved
    return out, ranking


torch.manual_seed(0)
w = torch.randn(3, requires_grad=True)
x, y = torch.randn(4, 3), torch.randn(4, 3)
out, ranking = score(w, x, y)
y.mul_(2)
x.add_(1)  # @culprit
out.sum().backward()
