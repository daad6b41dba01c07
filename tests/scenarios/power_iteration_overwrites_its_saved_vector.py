# A spectral-norm-like wrapper estimates the weight's largest singular value with one step of power
# iteration per call, and stores the new vector by overwriting `self.u.data`. The graph of each call
# saved `self.u` itself (in `torch.dot`), so the two calls feeding one loss both backpropagate
# through the last vector written: the weight's gradient is silently wrong.
# expect: silent-data-mutation tensor=self.u
# outcome: wrong-grad
import torch
import torch.nn.functional as F
from torch import nn


class PowerNormalized(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer
        self.register_buffer("u", F.normalize(torch.randn(layer.out_features), dim=0))

    def forward(self, x):
        w = self.layer.weight
        v = F.normalize(w.t() @ self.u, dim=0)  # @saved
        u = F.normalize(w @ v, dim=0)
        sigma = torch.dot(self.u, w @ v)  # @saved
        self.u.data = u.detach()  # @culprit
        return F.linear(x, w / sigma, self.layer.bias)


def critic_loss(critic, real, fake):
    return critic(fake).sum() - critic(real).sum()


torch.manual_seed(0)
critic = PowerNormalized(nn.Linear(6, 4))
opt = torch.optim.SGD(critic.parameters(), lr=0.01)
for step in range(2):
    loss = critic_loss(critic, torch.randn(8, 6), torch.randn(8, 6))
    opt.zero_grad()
    loss.backward()
    opt.step()
