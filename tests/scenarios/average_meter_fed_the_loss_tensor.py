# The AverageMeter of many training scripts, fed the loss tensor instead of loss.item(): its running
# sum links every step's backpropagated graph, and the meter lives inside the epoch function, gone
# when the block ends.
# expect: accumulated-graph tensor=self.sum
# outcome: ok
import torch
from torch import nn


class AverageMeter:
    def __init__(self):
        self.reset()

    def reset(self):
        self.val, self.avg, self.sum, self.count = 0, 0, 0, 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n  # @culprit
        self.count += n
        self.avg = self.sum / self.count


def train_epoch(model, loader, opt):
    losses = AverageMeter()
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.update(loss, x.size(0))
    return float(losses.avg)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = [(torch.randn(4, 8), torch.randint(0, 3, (4,))) for _ in range(5)]
print("epoch loss", train_epoch(model, loader, opt))
