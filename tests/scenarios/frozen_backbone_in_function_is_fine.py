# Fine-tuning a head in a training function; the backbone was frozen on purpose.
# expect: none
# outcome: ok
import torch
from torch import nn


def finetune(backbone, head, steps):
    for p in backbone.parameters():
        p.requires_grad_(False)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    for _ in range(steps):
        logits = head(backbone(torch.randn(4, 8)))
        loss = nn.functional.cross_entropy(logits, torch.tensor([0, 1, 1, 0]))
        opt.zero_grad()
        loss.backward()
        opt.step()


torch.manual_seed(0)
finetune(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Linear(8, 2), 3)
