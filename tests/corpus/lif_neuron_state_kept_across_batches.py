# A spiking classifier written like snnTorch's `init_hidden=True` neurons: each leaky neuron keeps
# its membrane potential on itself (`self.mem`) from call to call, and the training loop never
# resets it between batches, so the second batch's backward runs into the first batch's freed graph.
# expect: graph-freed tensor=self.mem
# outcome: raises RuntimeError
import torch
from torch import nn


class Leaky(nn.Module):
    def __init__(self, beta, threshold=1.0):
        super().__init__()
        self.beta = beta
        self.threshold = threshold
        self.mem = torch.zeros(1)

    def forward(self, current):
        self.mem = self.beta * self.mem + current  # @culprit
        return torch.sigmoid(5 * (self.mem - self.threshold))  # surrogate of the spike


class SpikingNet(nn.Module):
    def __init__(self, num_steps=3):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.lif1 = Leaky(beta=0.9)
        self.fc2 = nn.Linear(6, 2)
        self.lif2 = Leaky(beta=0.9)
        self.num_steps = num_steps

    def forward(self, x):
        spk_rec = []
        for _ in range(self.num_steps):
            spk1 = self.lif1(self.fc1(x))
            spk_rec.append(self.lif2(self.fc2(spk1)))
        return torch.stack(spk_rec).sum(0)


def train(net, batches):
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    for x, y in batches:
        loss = loss_fn(net(x), y)
        opt.zero_grad()
        loss.backward()  # @saved
        opt.step()


torch.manual_seed(0)
net = SpikingNet()
train(net, [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(2)])
