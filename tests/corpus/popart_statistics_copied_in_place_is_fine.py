# The PopArt update written so nn.Module keeps its parameters: the running statistics are
# changed in place (`copy_` under no_grad), as MAPPO's later popart.py does with buffers.
# Nothing to report.
# expect: none
# outcome: ok
import torch
import torch.nn as nn


class PopArt(nn.Module):
    def __init__(self, input_shape, output_shape, norm_axes=1, beta=0.99999):
        super(PopArt, self).__init__()
        self.beta, self.norm_axes = beta, norm_axes
        self.weight = nn.Parameter(torch.Tensor(output_shape, input_shape).normal_(0, 0.1))
        self.bias = nn.Parameter(torch.zeros(output_shape))
        self.stddev = nn.Parameter(torch.ones(output_shape), requires_grad=False)
        self.mean = nn.Parameter(torch.zeros(output_shape), requires_grad=False)
        self.mean_sq = nn.Parameter(torch.zeros(output_shape), requires_grad=False)

    def forward(self, input_vector):
        return nn.functional.linear(input_vector, self.weight, self.bias)

    @torch.no_grad()
    def update(self, input_vector):
        old_mean, old_stddev = self.mean.clone(), self.stddev.clone()
        batch_mean = input_vector.mean(dim=tuple(range(self.norm_axes)))
        batch_sq_mean = (input_vector ** 2).mean(dim=tuple(range(self.norm_axes)))
        self.mean.mul_(self.beta).add_(batch_mean * (1.0 - self.beta))
        self.mean_sq.mul_(self.beta).add_(batch_sq_mean * (1.0 - self.beta))
        self.stddev.copy_((self.mean_sq - self.mean ** 2).sqrt().clamp(min=1e-4))
        self.weight.copy_(self.weight * old_stddev[:, None] / self.stddev[:, None])
        self.bias.copy_((old_stddev * self.bias + old_mean - self.mean) / self.stddev)


torch.manual_seed(0)
value_normalizer = PopArt(4, 1)
value_normalizer.update(torch.randn(8, 1))
loss = value_normalizer(torch.randn(3, 4)).pow(2).mean()
loss.backward()
