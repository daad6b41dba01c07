# Gradient accumulation: a backward per micro-batch, and the micro-batch losses summed as tensors for
# the log line, which .item() reads. The sum is made anew at every optimizer step: what it keeps
# alive is one step's graphs, and it does not grow with the training.
# expect: none
# outcome: ok
import torch
from torch import nn


def train(model, opt, batches, accumulation=3):
    log = []
    for step in range(len(batches) // accumulation):
        opt.zero_grad()
        step_loss = 0
        for x, y in batches[step * accumulation:(step + 1) * accumulation]:
            loss = nn.functional.mse_loss(model(x), y) / accumulation
            loss.backward()
            step_loss = step_loss + loss
        opt.step()
        log.append(step_loss.item())
    return log


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
print(train(model, opt, [(torch.randn(2, 4), torch.randn(2, 1)) for _ in range(9)]))
