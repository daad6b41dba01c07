# WGAN-GP's critic step as caogang/wgan-gp writes it: the gradient of the critic at random
# interpolates is taken with torch.autograd.grad(create_graph=True, retain_graph=True), and its
# norm penalty is backpropagated with the critic's own losses. Nothing to report.
# expect: none
# outcome: ok
import torch
from torch import autograd, nn


def calc_gradient_penalty(netD, real_data, fake_data, lamda=10.0):
    alpha = torch.rand(real_data.size(0), 1).expand(real_data.size())
    interpolates = alpha * real_data + ((1 - alpha) * fake_data)
    interpolates = autograd.Variable(interpolates, requires_grad=True)
    disc_interpolates = netD(interpolates)
    gradients = autograd.grad(outputs=disc_interpolates, inputs=interpolates,
                              grad_outputs=torch.ones(disc_interpolates.size()),
                              create_graph=True, retain_graph=True, only_inputs=True)[0]
    return ((gradients.norm(2, dim=1) - 1) ** 2).mean() * lamda


def critic_step(netG, netD, optimizerD, real_data, noise):
    for p in netD.parameters():
        p.requires_grad = True
    netD.zero_grad()
    D_real = netD(real_data).mean()
    D_real.backward(-torch.ones(()))
    with torch.no_grad():
        fake = netG(noise)
    D_fake = netD(fake).mean()
    D_fake.backward(torch.ones(()))
    gradient_penalty = calc_gradient_penalty(netD, real_data, fake)
    gradient_penalty.backward()
    optimizerD.step()
    return (D_fake - D_real + gradient_penalty).item()


torch.manual_seed(0)
netG = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
netD = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
optimizerD = torch.optim.Adam(netD.parameters(), lr=1e-4, betas=(0.5, 0.9))
for _ in range(2):
    critic_step(netG, netD, optimizerD, torch.randn(5, 2), torch.randn(5, 3))
