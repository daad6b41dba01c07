# A multi-task step returns a dict of losses; the epoch loop sums each into a dict of running
# totals for the report at the end, as tensors: every entry links every step's graph.
# expect: accumulated-graph tensor=running[name]
# outcome: ok
import torch
from torch import nn


def compute_losses(model, x, y):
    out = model(x)
    return {"mse": nn.functional.mse_loss(out, y), "l1": nn.functional.l1_loss(out, y)}


def run_epoch(model, opt, batches):
    running = {}
    for x, y in batches:
        losses = compute_losses(model, x, y)
        opt.zero_grad()
        sum(losses.values()).backward()
        opt.step()
        for name, value in losses.items():
            running[name] = running.get(name, 0.0) + value  # @culprit
    return {name: total.item() / len(batches) for name, total in running.items()}


torch.manual_seed(0)
model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
print(run_epoch(model, opt, [(torch.randn(5, 4), torch.randn(5, 2)) for _ in range(4)]))
