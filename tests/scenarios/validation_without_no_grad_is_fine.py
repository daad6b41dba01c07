# The most common notebook pattern: a few training steps, then a validation loss computed
# without torch.no_grad(). It shares the parameters with the consumed training graphs, but
# chains none of them: no accumulation, no stale tensor.
# expect: none
# outcome: ok
import torch
from torch import nn


def fit(model, opt, batches):
    for x, y in batches:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
data = [(torch.randn(8, 3), torch.randn(8, 1)) for _ in range(4)]
for epoch in range(2):
    fit(model, opt, data)
    val_loss = nn.functional.mse_loss(model(data[0][0]), data[0][1])
    print("epoch", epoch, "validation", val_loss.item())
