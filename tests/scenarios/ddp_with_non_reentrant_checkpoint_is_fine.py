# The same model checkpointed without a reentrant backward (use_reentrant=False): its recomputation
# runs inside the backward's own graph, and DDP sees each gradient once.
# expect: none
# outcome: ok
import socket

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        h = checkpoint(self.blocks, x, use_reentrant=False)
        return self.out(h)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(ddp, steps):
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(steps):
        loss = ddp(torch.randn(3, 4, requires_grad=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


torch.manual_seed(0)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0, world_size=1)
try:
    model = Encoder()
    train(DDP(model, find_unused_parameters=True), 2)
finally:
    dist.destroy_process_group()
