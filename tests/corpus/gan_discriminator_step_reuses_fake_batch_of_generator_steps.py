# A GAN trained with several generator updates per discriminator update (the question's
# g_update_factor loop). The discriminator step then scores the last `fake_batch` of the generator
# loop without .detach(), so d_loss.backward() runs back into the generator graph that
# g_loss.backward() already freed.
# expect: graph-freed
# outcome: raises RuntimeError
import torch
from torch import nn

latent_dim = 4


def train(netG, netD, data_stream, total_epochs=1, g_update_factor=2):
    bce_loss = nn.BCELoss()
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4)
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
    for epoch in range(total_epochs):
        for batch_id, (real_batch, _) in enumerate(data_stream):
            real_batch = real_batch.view(-1, 16)
            bsz = real_batch.shape[0]
            for _ in range(g_update_factor):
                z = torch.randn(bsz, latent_dim)
                fake_batch = netG(z)
                gen_scores = netD(fake_batch).view(-1)
                g_loss = bce_loss(gen_scores, torch.ones_like(gen_scores))
                g_loss.backward()  # @saved
                optG.step()
                netG.zero_grad()
            real_scores = netD(real_batch).view(-1)
            fake_scores = netD(fake_batch).view(-1)  # @culprit
            d_loss = bce_loss(real_scores, torch.ones_like(real_scores)) + \
                bce_loss(fake_scores, torch.zeros_like(fake_scores))
            d_loss.backward()
            optD.step()
            netD.zero_grad()


torch.manual_seed(0)
netG = nn.Sequential(nn.Linear(latent_dim, 8), nn.ReLU(), nn.Linear(8, 16), nn.Tanh())
netD = nn.Sequential(nn.Linear(16, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1), nn.Sigmoid())
train(netG, netD, [(torch.randn(3, 1, 4, 4), torch.zeros(3))])
