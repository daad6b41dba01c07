# A domain-adaptation model under DistributedDataParallel returns the source prediction and a
# target-domain prediction; the loss uses only the source one. The target head runs in the
# forward but gets no gradient, DDP waits for it, and the next forward raises. (A process group
# of one, on gloo.)
# expect: ddp-unused-parameters tensor=net.tgt_head.weight
# outcome: raises RuntimeError
import torch
import torch.distributed as dist
from torch import nn


class DAModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(5, 8), nn.ReLU())
        self.src_head = nn.Linear(8, 3)
        self.tgt_head = nn.Linear(8, 2)

    def forward(self, src, tgt):
        src_pred = self.src_head(self.backbone(src))
        tgt_pred = self.tgt_head(self.backbone(tgt))
        return src_pred, tgt_pred


def train(model, optimizer, batches):
    for src, src_y, tgt in batches:
        src_pred, tgt_pred = model(src, tgt)  # @culprit
        loss = nn.functional.cross_entropy(src_pred, src_y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    torch.manual_seed(0)
    net = DAModel()
    model = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, optimizer, [(torch.randn(4, 5), torch.randint(0, 3, (4,)), torch.randn(4, 5)) for _ in range(2)])
finally:
    dist.destroy_process_group()
