# nflows' BatchNorm transform between the layers of a RealNVP-style flow (issue 10): in training it
# updates its buffers with `self.running_mean.mul_(1 - self.momentum).add_(mean * self.momentum)`,
# where `mean` still carries the batch's graph. The buffers take a grad_fn and chain every step's
# graph behind them: memory grows with each training step though no backward uses them.
# expect: accumulated-graph tensor=self.running_mean
# outcome: ok
import math

import torch
import torch.nn.functional as F
from torch import nn


class BatchNorm(nn.Module):
    def __init__(self, features, eps=1e-5, momentum=0.1):
        super().__init__()
        self.momentum = momentum
        self.eps = eps
        constant = math.log(math.exp(1 - eps) - 1)
        self.unconstrained_weight = nn.Parameter(constant * torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("running_var", torch.zeros(features))

    @property
    def weight(self):
        return F.softplus(self.unconstrained_weight) + self.eps

    def forward(self, inputs, context=None):
        if self.training:
            mean, var = inputs.mean(0), inputs.var(0)
            self.running_mean.mul_(1 - self.momentum).add_(mean * self.momentum)  # @culprit
            self.running_var.mul_(1 - self.momentum).add_(var * self.momentum)
        else:
            mean, var = self.running_mean, self.running_var
        outputs = self.weight * ((inputs - mean) / torch.sqrt((var + self.eps))) + self.bias
        logabsdet_ = torch.log(self.weight) - 0.5 * torch.log(var + self.eps)
        logabsdet = torch.sum(logabsdet_) * inputs.new_ones(inputs.shape[0])
        return outputs, logabsdet


class AffineCoupling(nn.Module):
    def __init__(self, features, mask):
        super().__init__()
        self.register_buffer("mask", mask)
        self.net = nn.Sequential(nn.Linear(features, 8), nn.ReLU(), nn.Linear(8, 2 * features))

    def forward(self, inputs, context=None):
        shift, unconstrained_scale = self.net(inputs * self.mask).chunk(2, dim=1)
        scale = torch.sigmoid(unconstrained_scale + 2) + 1e-3
        outputs = inputs * self.mask + (1 - self.mask) * (inputs * scale + shift)
        return outputs, ((1 - self.mask) * torch.log(scale)).sum(1)


class Flow(nn.Module):
    def __init__(self, features=2, num_layers=2):
        super().__init__()
        layers = []
        for i in range(num_layers):
            mask = torch.tensor([float((i + j) % 2) for j in range(features)])
            layers.append(AffineCoupling(features, mask))
            if i < num_layers - 1:
                layers.append(BatchNorm(features))
        self.transforms = nn.ModuleList(layers)

    def log_prob(self, inputs):
        total_logabsdet = inputs.new_zeros(inputs.shape[0])
        for transform in self.transforms:
            inputs, logabsdet = transform(inputs)
            total_logabsdet = total_logabsdet + logabsdet
        base = -0.5 * (inputs ** 2).sum(1) - 0.5 * inputs.shape[1] * math.log(2 * math.pi)
        return base + total_logabsdet


def make_moons(n):
    t = torch.rand(n) * math.pi
    upper = torch.rand(n) < 0.5
    x = torch.where(upper, torch.cos(t), 1 - torch.cos(t))
    y = torch.where(upper, torch.sin(t), 0.5 - torch.sin(t))
    return torch.stack([x, y], 1) + 0.1 * torch.randn(n, 2)


torch.manual_seed(0)
flow = Flow()
optimizer = torch.optim.Adam(flow.parameters())
for i in range(3):
    x = make_moons(16)
    optimizer.zero_grad()
    loss = -flow.log_prob(inputs=x).mean()
    loss.backward()
    optimizer.step()
