# A small Trainer class keeps every step's loss tensor in `self.history` for plotting later. Nothing
# adds them up, but the list holds each one with the graph its backward already ran, step after
# step; the trainer is made and dropped inside a function.
# expect: accumulated-graph tensor=loss
# outcome: ok
import torch
from torch import nn


class Trainer:
    def __init__(self, model, lr=0.05):
        self.model = model
        self.opt = torch.optim.Adam(model.parameters(), lr=lr)
        self.history = []

    def training_step(self, batch):
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.history.append(loss)  # @culprit
        return loss


def fit(model, batches, epochs=2):
    trainer = Trainer(model)
    for _ in range(epochs):
        for batch in batches:
            trainer.training_step(batch)
    return len(trainer.history)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
batches = [(torch.randn(6, 5), torch.randn(6, 1)) for _ in range(3)]
print(fit(model, batches), "steps")
