# DistributedDataParallel told that parameters may go unused (find_unused_parameters=True), and a
# branch the data skips on every other step: DDP finds the unused ones and finishes each iteration.
# expect: none
# outcome: ok
import socket

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.short = nn.Linear(4, 1)
        self.long = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x, deep):
        return self.long(x) if deep else self.short(x)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(model, steps):
    ddp = DDP(model, find_unused_parameters=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(steps):
        loss = ddp(torch.randn(3, 4), deep=step % 2 == 0).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


torch.manual_seed(0)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0, world_size=1)
try:
    model = Branchy()
    train(model, 3)
finally:
    dist.destroy_process_group()
