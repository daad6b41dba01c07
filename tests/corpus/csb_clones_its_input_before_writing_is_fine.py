# TSAN's CSB with the fix from the report: it clones its input (`out = x.clone()`) before writing the
# four re-mixed quadrants, so the dense branch's conv keeps the input it saved. Fine: trains.
# expect: none
# outcome: ok
import torch
from torch import nn


class DenseLayer(nn.Module):
    def __init__(self, n_feats):
        super().__init__()
        self.conv_1_1 = nn.Conv2d(n_feats, n_feats, 1)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out1x1 = self.relu(self.conv_1_1(x))
        return torch.cat([out1x1, x], 1)


class CSB(nn.Module):
    def __init__(self, n_feats):
        super().__init__()
        self.conv1 = nn.Conv2d(n_feats * 4, n_feats * 4, kernel_size=1, bias=False)

    def forward(self, x):
        h, w = x.size(2) // 2, x.size(3) // 2
        f1 = x[:, :, 0:h, 0:w]
        f2 = x[:, :, h:, 0:w]
        f3 = x[:, :, 0:h, w:]
        f4 = x[:, :, h:, w:]
        f_all = self.conv1(torch.cat([f1, f2, f3, f4], 1))
        c = f_all.size(1) // 4
        out = x.clone()
        out[:, :, 0:h, 0:w] = f_all[:, 0:c, :, :]
        out[:, :, h:, 0:w] = f_all[:, c:2 * c, :, :]
        out[:, :, 0:h, w:] = f_all[:, 2 * c:3 * c, :, :]
        out[:, :, h:, w:] = f_all[:, 3 * c:, :, :]
        return out


class MCAB(nn.Module):
    def __init__(self, n_feats):
        super().__init__()
        self.drb = DenseLayer(n_feats)
        self.conv_1x1 = nn.Conv2d(n_feats * 2, n_feats, kernel_size=1, bias=False)
        self.csb = CSB(n_feats)

    def forward(self, x):
        down_b = self.conv_1x1(self.drb(x))
        top_b = torch.sigmoid(self.csb(x))
        return down_b * top_b


class TSAN(nn.Module):
    def __init__(self, n_feats=4):
        super().__init__()
        self.first_conv = nn.Conv2d(3, n_feats, 1)
        self.body = MCAB(n_feats)
        self.output = nn.Conv2d(n_feats, 3, 3, padding=1)

    def forward(self, x):
        first_out = self.first_conv(x)
        return self.output(self.body(first_out)) + x


def train(model, optimizer, steps=2):
    for _ in range(steps):
        lr_img, hr_img = torch.randn(1, 3, 4, 4), torch.randn(1, 3, 4, 4)
        optimizer.zero_grad()
        loss = nn.functional.l1_loss(model(lr_img), hr_img)
        loss.backward()
        optimizer.step()


torch.manual_seed(0)
model = TSAN()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
train(model, optimizer)
