# The fix from the snnTorch thread: the network resets every leaky neuron's membrane potential at
# the start of its forward, so each batch starts a fresh graph. The state still lives on the
# neurons and is carried across time steps inside one forward: nothing to report.
# expect: none
# outcome: ok
import torch
from torch import nn


class Leaky(nn.Module):
    def __init__(self, beta, threshold=1.0):
        super().__init__()
        self.beta = beta
        self.threshold = threshold
        self.reset_hidden()

    def reset_hidden(self):
        self.mem = torch.zeros(1)

    def forward(self, current):
        self.mem = self.beta * self.mem + current
        return torch.sigmoid(5 * (self.mem - self.threshold))


def reset(net):
    for module in net.modules():
        if isinstance(module, Leaky):
            module.reset_hidden()


class SpikingNet(nn.Module):
    def __init__(self, num_steps=3):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 6), Leaky(beta=0.9), nn.Linear(6, 2), Leaky(beta=0.9))
        self.num_steps = num_steps

    def forward(self, x):
        reset(self.net)
        spk_rec = [self.net(x) for _ in range(self.num_steps)]
        return torch.stack(spk_rec).sum(0)


def train(net, batches):
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    for x, y in batches:
        loss = loss_fn(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


torch.manual_seed(0)
net = SpikingNet()
train(net, [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(2)])
