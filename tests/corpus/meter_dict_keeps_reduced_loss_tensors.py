# An MMF-style trainer reports losses through `update_meter`: it puts the total loss in as a number
# but `meter_update_dict.update(reduced_loss_dict)` adds the per-loss tensors themselves, and each
# SmoothedValue in the Meter sums what it is given, so `self.total` chains every iteration's graph.
# expect: accumulated-graph tensor=self.total
# outcome: ok
from collections import defaultdict, deque

import torch
from torch import nn


class SmoothedValue:
    def __init__(self, window_size=3):
        self.window_size = window_size
        self.reset()

    def reset(self):
        self.deque = deque(maxlen=self.window_size)
        self.total = 0.0
        self.count = 0

    def update(self, value, batch_size):
        self.deque.append(value * batch_size)
        self.count += batch_size
        self.total += value * batch_size  # @culprit

    @property
    def global_avg(self):
        return self.total / self.count


class Meter:
    def __init__(self):
        self.meters = defaultdict(SmoothedValue)

    def update(self, update_dict, batch_size):
        for k, v in update_dict.items():
            self.meters[k].update(v, batch_size)


def update_meter(report, meter):
    reduced_loss_dict = report["losses"]
    reduced_loss = sum(loss.mean() for loss in reduced_loss_dict.values())
    meter_update_dict = {"total_loss": reduced_loss.item()}
    meter_update_dict.update(reduced_loss_dict)
    meter.update(meter_update_dict, report["batch_size"])


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 3)
        self.classifier = nn.Linear(3, 2)

    def forward(self, batch):
        scores = self.classifier(torch.relu(self.encoder(batch["x"])))
        loss = nn.functional.cross_entropy(scores, batch["y"])
        return {"losses": {"train/ce": loss}, "batch_size": batch["x"].shape[0]}


def training_loop(model, optimizer, meter, batches):
    for batch in batches:
        report = model(batch)
        loss = sum(l.mean() for l in report["losses"].values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        update_meter(report, meter)


torch.manual_seed(0)
model = Model()
meter = Meter()
batches = [{"x": torch.randn(2, 4), "y": torch.tensor([0, 1])} for _ in range(4)]
training_loop(model, torch.optim.Adam(model.parameters()), meter, batches)
