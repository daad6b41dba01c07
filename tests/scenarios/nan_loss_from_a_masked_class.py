# A cross-entropy written by hand over classes some of which are masked out with -inf: their
# probability is exactly 0, log(0) is -inf, and 0 * -inf is NaN. The loss is NaN before backward
# runs, and backward carries it into the weights' gradient: the forward pass made it, at the line
# that first made a value that is not finite (a large negative fill keeps every value finite).
# expect: nan-gradient
# outcome: ok
import torch
from torch.nn import functional as F

torch.manual_seed(0)
w = torch.randn(4, 5, requires_grad=True)
x = torch.randn(8, 4)
target = F.one_hot(torch.randint(0, 3, (8,)), 5).float()
allowed = torch.tensor([True, True, True, False, False])
logits = (x @ w).masked_fill(~allowed, float("-inf"))  # @culprit
probs = logits.softmax(-1)
loss = -(target * probs.log()).sum()
loss.backward()
