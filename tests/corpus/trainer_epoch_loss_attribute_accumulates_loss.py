# A Trainer class averages the epoch's loss for its log line: `self.epoch_loss += loss` after each
# optimizer step, divided by the batch count at the end. The loss is a tensor, not a number, so the
# attribute links every batch's graph into one that grows until the epoch ends.
# expect: accumulated-graph tensor=self.epoch_loss
# outcome: ok
import torch
from torch import nn


class Trainer:
    def __init__(self, model, criterion, optimizer):
        self.model, self.criterion, self.optimizer = model, criterion, optimizer
        self.history = []

    def train_epoch(self, loader):
        self.model.train()
        self.epoch_loss = 0
        for inputs, targets in loader:
            output = self.model(inputs)
            loss = self.criterion(output, targets)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.epoch_loss += loss  # @culprit
        self.history.append(self.epoch_loss / len(loader))


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05))
loader = [(torch.randn(2, 3), torch.randn(2, 1)) for _ in range(4)]
trainer.train_epoch(loader)
