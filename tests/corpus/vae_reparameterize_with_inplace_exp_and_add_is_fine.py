# The VAE of the early PyTorch examples: `reparameterize` computes `logvar.mul(0.5).exp_()` and
# returns `eps.mul(std).add_(mu)`. exp_ writes a scalar product no node saved (and then saves its own
# result), add_ writes a product whose node saved only eps. Fine: trains without error.
# expect: none
# outcome: ok
import torch
import torch.nn.functional as F
from torch import nn


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 6)
        self.fc21 = nn.Linear(6, 2)
        self.fc22 = nn.Linear(6, 2)
        self.fc3 = nn.Linear(2, 6)
        self.fc4 = nn.Linear(6, 8)
        self.relu = nn.ReLU()
        self.sigmoid = nn.Sigmoid()

    def encode(self, x):
        h1 = self.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        if self.training:
            std = logvar.mul(0.5).exp_()
            eps = std.data.new(std.size()).normal_()
            return eps.mul(std).add_(mu)
        else:
            return mu

    def decode(self, z):
        h3 = self.relu(self.fc3(z))
        return self.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 8))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    bce = F.binary_cross_entropy(recon_x, x.view(-1, 8), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def train(model, optimizer, epoch):
    model.train()
    train_loss = 0
    for batch_idx in range(2):
        data = torch.rand(4, 8)
        optimizer.zero_grad()
        recon_batch, mu, logvar = model(data)
        loss = loss_function(recon_batch, data, mu, logvar)
        loss.backward()
        train_loss += loss.item()
        optimizer.step()
    return train_loss


torch.manual_seed(0)
model = VAE()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
train(model, optimizer, 1)
