# Linear probing: the frozen backbone runs under torch.inference_mode() (faster than no_grad), and
# its features feed the trainable head: "Inference tensors cannot be saved for backward".
# expect: inference-tensor-saved tensor=feats
# outcome: raises RuntimeError
import torch
from torch import nn


class LinearProbe:
    def __init__(self, backbone, head):
        self.backbone = backbone.eval()
        self.head = head
        self.opt = torch.optim.SGD(head.parameters(), lr=0.1)

    def step(self, images, labels):
        with torch.inference_mode():
            feats = self.backbone(images)  # @culprit
        logits = self.head(feats)  # @saved
        loss = nn.functional.cross_entropy(logits, labels)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


torch.manual_seed(0)
backbone = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
head = nn.Linear(16, 3)
LinearProbe(backbone, head).step(torch.randn(4, 8), torch.tensor([0, 1, 2, 1]))
