# pytorch/pytorch#51743: with reentrant checkpointing, backward(inputs=...) (here: the gradient of
# the loss for the input only, a saliency map that leaves the parameters' .grad alone) is refused,
# as torch.autograd.grad is; the non-reentrant implementation supports both.
# expect: checkpoint-incompatible
# outcome: raises RuntimeError
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        h = checkpoint(self.body, x, use_reentrant=True)  # @culprit
        return self.head(h)


torch.manual_seed(0)
net = Net()
x = torch.randn(3, 4, requires_grad=True)
loss = net(x).pow(2).mean()
loss.backward(inputs=[x])  # @saved
