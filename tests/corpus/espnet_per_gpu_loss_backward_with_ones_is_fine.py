# ESPnet's updater, with ngpu > 1, backpropagates the loss vector that DataParallel gathers from
# its replicas with loss.backward(loss.new_ones(self.ngpu)): a non-scalar backward with an
# explicit gradient of the right shape, since every batch fills the 4 replicas. (The scatter and
# gather of nn.DataParallel are spelled out with chunk and stack.) Nothing to report.
# expect: none
# outcome: ok
import torch
from torch import nn


class E2E(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(5, 8), nn.Tanh())
        self.dec = nn.Linear(8, 3)

    def forward(self, xs, ys):
        return nn.functional.cross_entropy(self.dec(self.enc(xs)), ys)


class DataParallelOnCPU(nn.Module):
    def __init__(self, module, ngpu):
        super().__init__()
        self.module, self.ngpu = module, ngpu

    def forward(self, xs, ys):
        replicas = zip(xs.chunk(self.ngpu), ys.chunk(self.ngpu))
        return torch.stack([self.module(x, y) for x, y in replicas])


class CustomUpdater:
    def __init__(self, model, optimizer, ngpu, grad_clip_threshold=5.0):
        self.model, self.optimizer, self.ngpu = model, optimizer, ngpu
        self.grad_clip_threshold = grad_clip_threshold

    def update_core(self, batch):
        xs, ys = batch
        self.optimizer.zero_grad()
        if self.ngpu > 1:
            loss = 1. / self.ngpu * self.model(xs, ys)
            loss.backward(loss.new_ones(self.ngpu))
        else:
            loss = self.model(xs, ys)
            loss.backward()
        loss.detach()
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip_threshold)
        if not torch.isnan(grad_norm):
            self.optimizer.step()


torch.manual_seed(0)
ngpu = 4
model = DataParallelOnCPU(E2E(), ngpu)
updater = CustomUpdater(model, torch.optim.Adadelta(model.parameters()), ngpu)
batches = [(torch.randn(8, 5), torch.randint(0, 3, (8,))) for _ in range(2)]
for batch in batches:
    updater.update_core(batch)
