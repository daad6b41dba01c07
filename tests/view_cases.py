"""Two notebooks for the tests of the graph view on real models (issues 27 and 31): a GAN (a
discriminator D and a generator G in one cell) whose generator step breaks backward with an
in-place write after a save, and a ResNet-like model with residual blocks trained for three
steps that keeps every step's graph alive. Both run backward before their problem, so their
module boxes carry gradient-health badges.

Each case is one `%%autograd` cell; `CULPRIT[case]` is its culprit's line in that cell, counting
the `%%autograd` line as line 1.
"""
from __future__ import annotations

GAN = '''%%autograd
import torch
from torch import nn


class Generator(nn.Module):
    def __init__(self, z_dim=16, out_dim=32):
        super().__init__()
        self.main = nn.Sequential(
            nn.Linear(z_dim, 64), nn.BatchNorm1d(64), nn.ReLU(True),
            nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(True),
            nn.Linear(64, out_dim), nn.Tanh())

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self, in_dim=32):
        super().__init__()
        self.main = nn.Sequential(
            nn.Linear(in_dim, 64), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(64, 64), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(64, 1))

    def forward(self, x):
        return self.main(x)


torch.manual_seed(0)
G, D = Generator(), Discriminator()
opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
bce = nn.BCEWithLogitsLoss()
real = torch.randn(8, 32)
ones, zeros = torch.ones(8, 1), torch.zeros(8, 1)
z = torch.randn(8, 16)
fake = G(z)
d_loss = bce(D(real), ones) + bce(D(fake.detach()), zeros)
opt_d.zero_grad()
d_loss.backward()
opt_d.step()
d_out = D(fake)
fake.clamp_(-0.9, 0.9)  # keep the samples inside the data's range
g_loss = bce(d_out, ones)
opt_g.zero_grad()
g_loss.backward()
opt_g.step()'''

RESNET = '''%%autograd
import torch
from torch import nn
import torch.nn.functional as F


class Residual(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + x)


class ResNet(nn.Module):
    def __init__(self, c=8, blocks=3, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.layers = nn.Sequential(*[Residual(c) for _ in range(blocks)])
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        h = self.layers(self.stem(x))
        return self.head(h.mean((2, 3)))


torch.manual_seed(0)
model = ResNet()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
running_loss = 0
for step in range(3):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    running_loss += loss'''

CASES = {"gan": GAN, "resnet": RESNET}
CULPRIT = {"gan": 44, "resnet": 43}   # fake.clamp_(-0.9, 0.9); running_loss += loss
KINDS = {"gan": "saved-tensor-modified", "resnet": "accumulated-graph"}


def run_in_shell(case: str):
    """Run a case's cell in a fresh InteractiveShell, as a notebook runs it; its Trace."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    InteractiveShell.clear_instance()
    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "jupyter_autograd")
        magic, body = CASES[case].split("\n", 1)
        with capture_output():
            shell.run_cell(magic + " -q -o _case_trace\n" + body, store_history=True)
        return shell.user_ns["_case_trace"]
    finally:
        shell.run_line_magic("unload_ext", "jupyter_autograd")
        InteractiveShell.clear_instance()
