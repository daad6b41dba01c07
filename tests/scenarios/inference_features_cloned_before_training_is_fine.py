# The same linear probe, with the features cloned outside inference mode: a normal tensor, which
# the head's graph can save.
# expect: none
# outcome: ok
import torch
from torch import nn


class LinearProbe:
    def __init__(self, backbone, head):
        self.backbone = backbone.eval()
        self.head = head
        self.opt = torch.optim.SGD(head.parameters(), lr=0.1)

    def step(self, images, labels):
        with torch.inference_mode():
            feats = self.backbone(images)
        feats = feats.clone()
        loss = nn.functional.cross_entropy(self.head(feats), labels)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


torch.manual_seed(0)
backbone = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
head = nn.Linear(16, 3)
LinearProbe(backbone, head).step(torch.randn(4, 8), torch.tensor([0, 1, 2, 1]))
