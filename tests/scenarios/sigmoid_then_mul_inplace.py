# expect: saved-tensor-modified tensor=act
# outcome: raises RuntimeError
import torch

x = torch.randn(8, requires_grad=True)
act = x.sigmoid()  # @saved
act.mul_(2)  # @culprit
act.sum().backward()
