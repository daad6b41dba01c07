# M3AE's pretraining (issue 15): under DataParallel the model gets its batch as the scatter's outputs,
# views a custom Function made with grad off, and the forward fills masked patches of each sample in
# place from a learnable image: `x[l] = x[l] * mask + self.limage[...] * (1 - mask)`. Writing a
# learnable value into such a view is refused. DataParallel's scatter is written as its Function here.
# expect: view-inplace
# outcome: raises RuntimeError
import torch
from torch import nn


class Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, chunks, input):
        return tuple(input.chunk(chunks, 0))  # @saved

    @staticmethod
    def backward(ctx, *grad_outputs):
        return None, torch.cat(grad_outputs, 0)


class DataParallel(nn.Module):
    def __init__(self, module, num_replicas=2):
        super().__init__()
        self.module, self.num_replicas = module, num_replicas

    def forward(self, inputs, locations):
        scattered = Scatter.apply(self.num_replicas, inputs)  # @saved
        per_replica = len(locations) // self.num_replicas
        outputs = [self.module(x, locations[i * per_replica:(i + 1) * per_replica]) for i, x in enumerate(scattered)]
        return torch.cat(outputs, 0)


def mask_embedding(patch, mask_ratio):
    return (torch.rand(1, 1, patch, patch) > mask_ratio).float()


class Unet(nn.Module):
    def __init__(self, channels=2, size=8, patch=4, mask_ratio=0.5):
        super().__init__()
        self.patch, self.mask_ratio = patch, mask_ratio
        self.limage = nn.Parameter(torch.zeros(1, channels, size, size))
        self.net = nn.Sequential(nn.Conv2d(channels, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, channels, 3, padding=1))

    def forward(self, x, location):
        for l in range(x.shape[0]):
            mask = mask_embedding(self.patch, self.mask_ratio)
            r, c = location[l]
            x[l] = x[l] * mask + self.limage[:, :, r:r + self.patch, c:c + self.patch] * (1 - mask)  # @culprit
        return self.net(x)


torch.manual_seed(0)
model_1 = DataParallel(Unet())
optimizer = torch.optim.Adam(model_1.parameters(), lr=1e-3)
inputs_S1 = torch.randn(4, 2, 4, 4)
patch_locations = [(0, 0), (4, 4), (0, 4), (4, 0)]
optimizer.zero_grad()
segs_S1 = model_1(inputs_S1, patch_locations)
loss = torch.pow((inputs_S1 - segs_S1), 2).mean()
loss.backward()
optimizer.step()
