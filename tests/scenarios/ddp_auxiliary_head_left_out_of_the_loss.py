# A multi-task model under DistributedDataParallel (gloo, one process): the auxiliary head is only
# used when aux targets come, and the first batches have none. DDP waits for its gradients, never
# finishes the first iteration, and the second forward raises "Expected to have finished reduction
# in the prior iteration ... Parameter indices which did not receive grad for rank 0: 4 5".
# expect: ddp-unused-parameters tensor=model.aux_head.weight
# outcome: raises RuntimeError
import socket

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class MultiTask(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(4, 8)
        self.head = nn.Linear(8, 1)
        self.aux_head = nn.Linear(8, 2)

    def forward(self, x, with_aux=False):
        h = torch.relu(self.trunk(x))
        return (self.head(h), self.aux_head(h)) if with_aux else self.head(h)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(model, batches):
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for x, y in batches:
        out = ddp(x)  # @culprit
        loss = nn.functional.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()


torch.manual_seed(0)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0, world_size=1)
try:
    model = MultiTask()
    train(model, [(torch.randn(3, 4), torch.randn(3, 1)) for _ in range(2)])
finally:
    dist.destroy_process_group()
