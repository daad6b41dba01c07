# PyTorch's AMP recipe (the GradScaler examples of the AMP docs): the model stays in float32, autocast
# runs the forward in lower precision, and the scaler unscales the float32 gradients before
# clipping. Nothing to report.
# expect: none
# outcome: ok
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=16.0)
for _ in range(2):
    x, y = torch.randn(3, 4), torch.randn(3, 2)
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
