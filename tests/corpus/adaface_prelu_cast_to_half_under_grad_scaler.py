# mk-minchul/AdaFace#127: training with mixed precision (autocast and a GradScaler), the reporter
# had changed one PReLU of the backbone to float16. Its weight's gradient is float16 too, and the
# scaler refuses to unscale float16 gradients ("I accidentally modified the original code PReLU
# layer to use a torch.Float16 datatype which was causing the issue").
# expect: fp16-gradients
# outcome: raises ValueError
import torch
from torch import nn


class BasicBlockIR(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)
        self.prelu = nn.PReLU(channels).to(torch.float16)  # @culprit

    def forward(self, x):
        out = self.bn(self.conv(x))
        return self.prelu(out.half()).float() + x


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(BasicBlockIR(2), BasicBlockIR(2))
        self.head = nn.Linear(2 * 4 * 4, 3)

    def forward(self, x):
        return self.head(self.body(x).flatten(1))


torch.manual_seed(0)
model = Backbone()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=16.0)
images, labels = torch.randn(2, 2, 4, 4) * 0.1, torch.tensor([0, 2])
with torch.autocast("cpu", dtype=torch.bfloat16):
    loss = nn.functional.cross_entropy(model(images).float(), labels)
scaler.scale(loss).backward()
scaler.unscale_(optimizer)  # @saved
torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
scaler.step(optimizer)
scaler.update()
