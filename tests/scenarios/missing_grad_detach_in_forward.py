# A module detaches its hidden activation (copied from a stop-gradient trick): the first layer's
# parameters, held by the optimizer, never get a gradient, and nothing raises.
# expect: missing-grad tensor=model.encoder.weight
# outcome: ok
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 8)
        self.decoder = nn.Linear(8, 1)

    def forward(self, x):
        h = torch.tanh(self.encoder(x)).detach()  # @culprit
        return self.decoder(h)


torch.manual_seed(0)
model = Model()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    loss = model(torch.randn(3, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
