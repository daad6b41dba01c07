# marlbenchmark/on-policy#19: MAPPO's PopArt layer keeps its running statistics as
# nn.Parameter(..., requires_grad=False) and its update() rebinds them to newly computed tensors
# (`self.stddev = (self.mean_sq - self.mean ** 2).sqrt().clamp(min=1e-4)`); nn.Module refuses to
# replace a parameter with a plain tensor.
# expect: not-a-parameter tensor=self.stddev
# outcome: raises TypeError
import torch
import torch.nn as nn


class PopArt(nn.Module):
    def __init__(self, input_shape, output_shape, norm_axes=1, beta=0.99999, epsilon=1e-5):
        super(PopArt, self).__init__()
        self.beta, self.epsilon, self.norm_axes = beta, epsilon, norm_axes
        self.weight = nn.Parameter(torch.Tensor(output_shape, input_shape).normal_(0, 0.1))
        self.bias = nn.Parameter(torch.zeros(output_shape))
        self.stddev = nn.Parameter(torch.ones(output_shape), requires_grad=False)  # @saved
        self.mean = nn.Parameter(torch.zeros(output_shape), requires_grad=False)
        self.mean_sq = nn.Parameter(torch.zeros(output_shape), requires_grad=False)

    def forward(self, input_vector):
        return nn.functional.linear(input_vector, self.weight, self.bias)

    @torch.no_grad()
    def update(self, input_vector):
        old_mean, old_stddev = self.mean, self.stddev
        batch_mean = input_vector.mean(dim=tuple(range(self.norm_axes)))
        batch_sq_mean = (input_vector ** 2).mean(dim=tuple(range(self.norm_axes)))
        self.mean.mul_(self.beta).add_(batch_mean * (1.0 - self.beta))
        self.mean_sq.mul_(self.beta).add_(batch_sq_mean * (1.0 - self.beta))
        self.stddev = (self.mean_sq - self.mean ** 2).sqrt().clamp(min=1e-4)  # @culprit
        self.weight = self.weight * old_stddev / self.stddev
        self.bias = (old_stddev * self.bias + old_mean - self.mean) / self.stddev


torch.manual_seed(0)
value_normalizer = PopArt(4, 1)
value_normalizer.update(torch.randn(8, 1))
