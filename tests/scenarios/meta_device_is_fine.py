# A model built on the meta device (no storage) and initialised through .data before use:
# meta tensors have no memory to overlap, so nothing can be reported.
# expect: none
# outcome: ok
import torch
from torch import nn

with torch.device("meta"):
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
x = torch.randn(3, 4, device="meta")
loss = model(x).sum()
for p in model.parameters():
    p.data.zero_()
