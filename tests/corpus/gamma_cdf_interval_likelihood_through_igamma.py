# A precipitation model predicts a Gamma distribution per sample and scores binned observations by
# the probability mass of their bin, CDF(upper) - CDF(lower), with the Gamma CDF written through
# torch.special.gammainc because torch.distributions.Gamma has no cdf. The predicted concentration
# is the first argument of igamma, whose derivative PyTorch does not implement.
# expect: not-differentiable
# outcome: raises NotImplementedError
import torch
from torch import nn
from torch.nn import functional as F


class GammaWithCDF:
    def __init__(self, concentration, rate):
        self.concentration, self.rate = concentration, rate

    def cdf(self, value):
        return torch.special.gammainc(self.concentration, self.rate * value)  # @culprit


class PrecipitationNet(nn.Module):
    def __init__(self, n_features=5):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_features, 8), nn.Tanh())
        self.concentration = nn.Linear(8, 1)
        self.rate = nn.Linear(8, 1)

    def forward(self, x):
        h = self.body(x)
        return GammaWithCDF(F.softplus(self.concentration(h)) + 1e-3, F.softplus(self.rate(h)) + 1e-3)


def interval_nll(dist, lower, upper):
    mass = dist.cdf(upper) - dist.cdf(lower)
    return -torch.log(mass.clamp_min(1e-6)).mean()


def fit(model, loader, epochs=1):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(epochs):
        for x, lower, upper in loader:
            loss = interval_nll(model(x), lower, upper)
            opt.zero_grad()
            loss.backward()  # @saved
            opt.step()


torch.manual_seed(0)
model = PrecipitationNet()
lower = torch.rand(6, 1) * 2
fit(model, [(torch.randn(6, 5), lower, lower + 0.5)])
