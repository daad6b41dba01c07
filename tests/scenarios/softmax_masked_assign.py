# softmax saves its output; a masked assignment afterwards overwrites it.
# expect: saved-tensor-modified tensor=probs
# outcome: raises RuntimeError
import torch

logits = torch.randn(4, 5, requires_grad=True)
mask = torch.tensor([True, False, True, False, False])
probs = torch.softmax(logits, dim=-1)  # @saved
probs[:, mask] = 0.0  # @culprit
loss = (probs * torch.arange(5.0)).sum()
loss.backward()
