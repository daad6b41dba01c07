# GAN training: the discriminator's step changes its weights in place, but the generator's
# loss was computed from a graph that saved them. Backward meets the last layer first (PyTorch's
# own error names a [8, 1] tensor: D.2.weight.t()), so that is the tensor named; the rest are listed.
# expect: saved-tensor-modified tensor=D.2.weight
# outcome: raises RuntimeError
import torch
from torch import nn

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))
D = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
opt_d = torch.optim.SGD(D.parameters(), lr=0.1)
fake = G(torch.randn(16, 4))
d_out = D(fake)  # @saved
d_loss = d_out.mean()
g_loss = -d_out.mean()
opt_d.zero_grad()
d_loss.backward(retain_graph=True)
opt_d.step()  # @culprit
g_loss.backward()
