# A model runs its body through checkpoint_sequential (reentrant checkpointing) and is wrapped in
# DistributedDataParallel with find_unused_parameters=True. The parameters of the checkpointed
# segments are used again in the reentrant backward that recomputes them, and DDP finds a
# parameter marked ready twice. (A process group of one, on gloo.)
# expect: ddp-ready-twice
# outcome: raises RuntimeError
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential


class Net(nn.Module):
    def __init__(self, width=8, depth=4, segments=2):
        super().__init__()
        self.input_layer = nn.Linear(3, width)
        self.body = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(depth)])
        self.output_layer = nn.Linear(width, 1)
        self.segments = segments

    def forward(self, x):
        h = self.input_layer(x)
        h = checkpoint_sequential(self.body, self.segments, h, use_reentrant=True)  # @culprit
        return self.output_layer(h)


def train(model, optimizer, batches):
    for x, y in batches:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # @saved
        optimizer.step()


dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Net(), find_unused_parameters=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train(model, optimizer, [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(2)])
finally:
    dist.destroy_process_group()
