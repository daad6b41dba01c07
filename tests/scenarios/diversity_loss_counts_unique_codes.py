# A codebook "diversity" term rewards using many distinct codes; torch.unique on the quantised
# embeddings has no derivative, and backward stops there: "the derivative for '_unique2' is not
# implemented".
# expect: not-differentiable tensor=codes
# outcome: raises NotImplementedError
import torch
from torch import nn


class DiversityLoss(nn.Module):
    def forward(self, z):
        codes = torch.unique(z.round(), dim=0)  # @culprit
        return -codes.shape[0] * codes.abs().mean()


def train_step(encoder, criterion, x):
    z = encoder(x)
    loss = z.pow(2).mean() + 0.1 * criterion(z)
    loss.backward()  # @saved
    return loss.item()


torch.manual_seed(0)
encoder = nn.Linear(4, 2)
train_step(encoder, DiversityLoss(), torch.randn(8, 4))
