# Image2Reverb's training_step (image2reverb/model.py) in its manual-optimization path: in the
# generator's and encoder's steps the discriminator scores `fake_spec.detach()`, so the
# adversarial term G_loss1 never reaches the generator: the generator step is trained by the L1
# term alone (the maintainer confirmed the bug). The encoder, discriminator and generator are small
# linear networks; the T60 term is off.
# expect: graph-cut
# outcome: ok
import torch
from torch import nn
from torch.nn import functional as F

LAMBDA = 100


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 4), nn.ReLU())

    def forward(self, x):
        return self.net(x).view(x.shape[0], 4, 1, 1), None


class Generator(nn.Module):
    def __init__(self, latent_dimension):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(latent_dimension, 16), nn.Tanh(), nn.Linear(16, 8))

    def forward(self, z):
        return self.net(z.flatten(1))


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8 + 4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))

    def forward(self, x, f):
        return self.net(torch.cat([x, f.flatten(1)], dim=1))


class Image2Reverb(nn.Module):
    def __init__(self, latent_dimension=8, d_threshold=0.2):
        super().__init__()
        self._latent_dimension = latent_dimension
        self._d_threshold = d_threshold
        self._opt = (d_threshold != None) and (d_threshold > 0) and (d_threshold < 1)
        self.enc = Encoder()
        self.g = Generator(latent_dimension)
        self.d = Discriminator()
        self.opts = self.configure_optimizers()

    def training_step(self, batch, batch_idx, optimizer_idx):
        opts = self.opts if self._opt else None
        spec, label = batch
        spec.requires_grad = True
        f = self.enc.forward(label)[0]
        z = torch.cat((f, torch.randn((f.shape[0], self._latent_dimension - f.shape[1], f.shape[2], f.shape[3]))), 1)
        fake_spec = self.g(z)
        d_fake = self.d(fake_spec.detach(), f)
        d_real = self.d(spec, f)
        if optimizer_idx == 0 or optimizer_idx == 1:
            d_fake2 = self.d(fake_spec.detach(), f)  # @culprit
            G_loss1 = F.mse_loss(d_fake2, torch.ones(d_fake2.shape))
            G_loss2 = F.l1_loss(fake_spec, spec)
            G_loss = G_loss1 + (LAMBDA * G_loss2)
            if self._opt:
                G_loss.backward()
                opts[optimizer_idx].step()
                opts[optimizer_idx].zero_grad()
            return G_loss
        else:
            l_fakeD = F.mse_loss(d_fake, torch.zeros(d_fake.shape))
            l_realD = F.mse_loss(d_real, torch.ones(d_real.shape))
            D_loss = (l_realD + l_fakeD)
            if self._opt and (D_loss > self._d_threshold):
                D_loss.backward()
                opts[optimizer_idx].step()
                opts[optimizer_idx].zero_grad()
            return D_loss

    def configure_optimizers(self):
        g_optim = torch.optim.Adam(self.g.parameters(), lr=4e-4, betas=(0.0, 0.99), eps=1e-8)
        d_optim = torch.optim.Adam(self.d.parameters(), lr=2e-4, betas=(0.0, 0.99), eps=1e-8)
        enc_optim = torch.optim.Adam(self.enc.parameters(), lr=1e-5, betas=(0.0, 0.99), eps=1e-8)
        return [enc_optim, g_optim, d_optim]


def fit(model, batches):
    for batch_idx, batch in enumerate(batches):
        for optimizer_idx in range(3):
            model.training_step(batch, batch_idx, optimizer_idx)


torch.manual_seed(0)
model = Image2Reverb()
fit(model, [(torch.randn(3, 8), torch.randn(3, 6)) for _ in range(2)])
