# A regression trainer builds its criterion with reduction='none' (to look at per-sample errors)
# and hands the per-sample loss straight to backward(): "grad can be implicitly created only for
# scalar outputs". The reduction belongs where the loss is made.
# expect: nonscalar-backward tensor=loss
# outcome: raises RuntimeError
import torch
from torch import nn


class Trainer:
    def __init__(self, model):
        self.model = model
        self.criterion = nn.MSELoss(reduction="none")
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(self, x, y):
        pred = self.model(x)
        loss = self.criterion(pred, y)  # @culprit
        self.opt.zero_grad()
        loss.backward()  # @saved
        self.opt.step()
        return loss.detach()


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
trainer = Trainer(model)
trainer.step(torch.randn(5, 3), torch.randn(5, 1))
