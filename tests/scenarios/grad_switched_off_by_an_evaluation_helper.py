# An evaluation helper switches gradient recording off for the whole thread and switches it back
# only on the path that logs: after the first evaluation, every later training step runs without a
# graph. The cut is the helper's `torch.set_grad_enabled(False)`, not the training line where it
# was met.
# expect: graph-cut tensor=loss
# outcome: raises RuntimeError
import torch
from torch import nn


class Trainer:
    def __init__(self, model):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.history = []

    def evaluate(self, x, y, log=False):
        torch.set_grad_enabled(False)  # @culprit
        error = nn.functional.mse_loss(self.model(x), y).item()
        if log:
            self.history.append(error)
            torch.set_grad_enabled(True)
        return error

    def fit(self, batches):
        for step, (x, y) in enumerate(batches):
            loss = nn.functional.mse_loss(self.model(x), y)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            if step % 2 == 0:
                self.evaluate(x, y, log=step == 4)


torch.manual_seed(0)
trainer = Trainer(nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1)))
try:
    trainer.fit([(torch.randn(16, 3), torch.randn(16, 1)) for _ in range(6)])
finally:
    torch.set_grad_enabled(True)  # the mode is global: leave the process as it was
