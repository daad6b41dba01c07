# Activation checkpointing the old (reentrant) way inside a model trained with
# DistributedDataParallel(find_unused_parameters=True): DDP finds no path to the checkpointed
# block's parameters, marks them ready, and the checkpoint's own backward delivers their gradients
# again: "Expected to mark a variable ready only once ... Parameter at index 3 with name
# blocks.2.bias has been marked as ready twice".
# expect: ddp-ready-twice tensor=model.blocks.2.bias
# outcome: raises RuntimeError
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
        h = checkpoint(self.blocks, x, use_reentrant=True)  # @culprit
        return self.out(h)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_step(ddp, x):
    loss = ddp(x).pow(2).mean()
    loss.backward()  # @saved


torch.manual_seed(0)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0, world_size=1)
try:
    model = Encoder()
    train_step(DDP(model, find_unused_parameters=True), torch.randn(3, 4, requires_grad=True))
finally:
    dist.destroy_process_group()
