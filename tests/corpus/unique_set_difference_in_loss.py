# A custom loss finds the values that the prediction and the target do not share with the
# Stack Overflow recipe for a set difference, cat + unique(return_counts=True), and penalises
# them. The forward runs; backward raises, because torch.unique has no derivative.
# expect: not-differentiable
# outcome: raises NotImplementedError
import torch
from torch import nn


class SetDifferenceLoss(nn.Module):
    def forward(self, t1, t2):
        combined = torch.cat((t1, t2))
        uniques, counts = combined.unique(return_counts=True)  # @culprit
        difference = uniques[counts == 1]
        return difference.abs().mean()


class PeakPredictor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, signal):
        return torch.round(self.net(signal) * 4) / 4  # positions on a quarter grid


torch.manual_seed(0)
model = PeakPredictor()
criterion = SetDifferenceLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
signal, peaks = torch.randn(8), torch.tensor([0.25, 0.5, 1.0, 1.75])
loss = criterion(model(signal), peaks)
optimizer.zero_grad()
loss.backward()  # @saved
optimizer.step()
