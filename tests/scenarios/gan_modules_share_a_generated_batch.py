# A GAN step written with module classes, inside a training function: the discriminator's loss
# uses the generated batch without detaching it, so its backward frees the generator's graph,
# and the generator's loss runs into it. The use that counts is the call `D(fake)` in the
# training function, not the `self.net(x)` inside D.forward that all three D calls share.
# expect: graph-freed tensor=fake
# outcome: raises RuntimeError
import torch
from torch import nn


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 6), nn.Tanh())

    def forward(self, z):
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)


def gan_step(G, D, opt_g, opt_d, real):
    bce = nn.BCEWithLogitsLoss()
    fake = G(torch.randn(real.size(0), 4))
    ones, zeros = torch.ones(real.size(0), 1), torch.zeros(real.size(0), 1)
    opt_d.zero_grad()
    d_loss = bce(D(real), ones) + bce(D(fake), zeros)
    d_loss.backward()  # @saved
    opt_d.step()
    opt_g.zero_grad()
    g_loss = bce(D(fake), ones)  # @culprit
    g_loss.backward()
    opt_g.step()


torch.manual_seed(0)
G, D = Generator(), Discriminator()
opt_g = torch.optim.Adam(G.parameters(), lr=2e-4)
opt_d = torch.optim.Adam(D.parameters(), lr=2e-4)
for _ in range(2):
    gan_step(G, D, opt_g, opt_d, torch.randn(8, 6))
