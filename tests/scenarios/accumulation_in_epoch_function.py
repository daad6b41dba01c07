# The loss is summed as a tensor inside an epoch function that returns a Python number: the
# tensor is gone when the block ends, but every iteration's graph was kept alive all epoch.
# expect: accumulated-graph tensor=running_loss
# outcome: ok
import torch
from torch import nn


def train_epoch(model, opt, batches):
    running_loss = 0.0
    for x, y in batches:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        running_loss += loss  # @culprit
    return running_loss.item() / len(batches)


torch.manual_seed(0)
model = nn.Linear(6, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [(torch.randn(4, 6), torch.randint(0, 3, (4,))) for _ in range(5)]
print(train_epoch(model, opt, batches))
