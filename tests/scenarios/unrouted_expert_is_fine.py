# A mixture of experts whose router sends this batch to one expert only: the other expert gets no
# gradient by design. Information, not a problem.
# expect: none
# outcome: ok
import torch
from torch import nn


class MoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.router = nn.Linear(4, 2)

    def forward(self, x):
        choice = int(self.router(x).mean(0).argmax())
        return self.experts[choice](x) * self.router(x).softmax(-1)[:, choice:choice + 1]


torch.manual_seed(0)
model = MoE()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss = model(torch.randn(3, 4)).pow(2).mean()
opt.zero_grad()
loss.backward()
opt.step()
