# caogang/wgan-gp#4: the asker's calc_gradient_penalty took the critic's gradient at the
# interpolates with torch.autograd.grad but without create_graph=True, and backpropagated the
# penalty on its own (`penalty.backward()`): the gradient autograd.grad returned has no graph, so
# neither has the penalty, and backward raises.
# expect: graph-cut tensor=penalty
# outcome: raises RuntimeError
import torch
from torch import autograd, nn


def calc_gradient_penalty(netD, real_data, fake_data, lamda=10.0):
    alpha = torch.rand(real_data.size(0), 1).expand(real_data.size())
    interpolates = alpha * real_data + ((1 - alpha) * fake_data)
    interpolates = autograd.Variable(interpolates, requires_grad=True)
    disc_interpolates = netD(interpolates)
    gradients = autograd.grad(outputs=disc_interpolates, inputs=interpolates,  # @culprit
                              grad_outputs=torch.ones(disc_interpolates.size()))[0]
    return ((gradients.norm(2, dim=1) - 1) ** 2).mean() * lamda


torch.manual_seed(0)
netG = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
netD = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
optimizerD = torch.optim.Adam(netD.parameters(), lr=1e-4, betas=(0.5, 0.9))
real_data = torch.randn(5, 2)
netD.zero_grad()
D_real = netD(real_data).mean()
D_real.backward(-torch.ones(()))
with torch.no_grad():
    fake = netG(torch.randn(5, 3))
D_fake = netD(fake).mean()
D_fake.backward(torch.ones(()))
penalty = calc_gradient_penalty(netD, real_data, fake)
penalty.backward()
optimizerD.step()
