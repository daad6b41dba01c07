# A pytracking-style LTRTrainer logs each batch's stats through `_update_stats`, which keeps one
# AverageMeter per stat name in a dict per loader. The actor puts the loss tensor itself in its
# stats, so `AverageMeter.update` sums graph-carrying tensors: `self.sum` links every batch's graph
# into one that grows for the whole epoch.
# expect: accumulated-graph tensor=self.sum
# outcome: ok
from collections import OrderedDict

import torch
from torch import nn


class AverageMeter:
    def __init__(self):
        self.reset()

    def reset(self):
        self.val = 0
        self.avg = 0
        self.sum = 0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n  # @culprit
        self.count += n
        self.avg = self.sum / self.count


class Actor:
    def __init__(self, net, objective):
        self.net, self.objective = net, objective

    def __call__(self, data):
        pred = self.net(data["train_images"])
        loss = self.objective(pred, data["train_anno"])
        stats = {"Loss/total": loss, "Loss/iou": loss}
        return loss, stats


class LTRTrainer:
    def __init__(self, actor, optimizer):
        self.actor, self.optimizer = actor, optimizer
        self.stats = OrderedDict()

    def cycle_dataset(self, loader_name, loader):
        for i, data in enumerate(loader, 1):
            loss, stats = self.actor(data)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self._update_stats(stats, data["train_images"].shape[0], loader_name)

    def _update_stats(self, new_stats, batch_size, loader_name):
        if loader_name not in self.stats.keys() or self.stats[loader_name] is None:
            self.stats[loader_name] = OrderedDict({name: AverageMeter() for name in new_stats.keys()})
        for name, val in new_stats.items():
            if name not in self.stats[loader_name].keys():
                self.stats[loader_name][name] = AverageMeter()
            self.stats[loader_name][name].update(val, batch_size)


torch.manual_seed(0)
net = nn.Linear(4, 1)
trainer = LTRTrainer(Actor(net, nn.MSELoss()), torch.optim.SGD(net.parameters(), lr=0.01))
loader = [{"train_images": torch.randn(2, 4), "train_anno": torch.randn(2, 1)} for _ in range(4)]
trainer.cycle_dataset("train", loader)
