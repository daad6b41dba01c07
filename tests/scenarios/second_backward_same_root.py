# backward() called twice on the same loss (to "accumulate" a second time): the first call
# freed the graph's buffers.
# expect: graph-freed tensor=loss
# outcome: raises RuntimeError
import torch

torch.manual_seed(0)
w = torch.randn(3, requires_grad=True)
loss = (w.exp() * torch.randn(3)).sum()
loss.backward()  # @saved
loss.backward()  # @culprit
