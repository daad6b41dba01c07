# A training step in a function, with a block checkpointed the old (reentrant) way: its parameters
# get their gradients from a backward that runs inside the engine, and the model is gone when the
# block ends. Nothing is missing.
# expect: none
# outcome: ok
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        h = checkpoint(self.block, x, use_reentrant=True)
        return self.head(h)


def train(steps):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        x = torch.randn(2, 4, requires_grad=True)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


torch.manual_seed(0)
train(2)
