# The argmax of the logits is used for the accuracy only; the loss is computed from the logits
# themselves. Every parameter gets its gradient.
# expect: none
# outcome: ok
import torch
from torch import nn


def train_epoch(model, opt, batches):
    correct, seen = 0, 0
    for x, y in batches:
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        predicted = logits.argmax(dim=1)
        correct += (predicted == y).sum().item()
        seen += y.numel()
    return correct / seen


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
print(train_epoch(model, opt, [(torch.randn(6, 5), torch.randint(0, 3, (6,))) for _ in range(3)]))
