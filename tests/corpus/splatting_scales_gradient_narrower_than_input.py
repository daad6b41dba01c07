# A 2D Gaussian-splatting model keeps 3 scales per Gaussian, as 3DGS does, and hands them to a
# rasterizer written for 2D splats: its forward reads the first two scales and its backward
# returns a gradient for those two only, so autograd finds an [N, 2] gradient for an [N, 3] input.
# expect: invalid-gradient
# outcome: raises RuntimeError
import torch
from torch import nn


class _RasterizeGaussians(torch.autograd.Function):
    @staticmethod
    def forward(ctx, means2D, opacities, scales, pixels):
        ctx.save_for_backward(means2D, opacities, scales, pixels)
        s = scales[:, :2]
        d = (pixels[:, None, :] - means2D[None, :, :]) / s[None, :, :]
        weights = torch.exp(-0.5 * d.pow(2).sum(-1)) * opacities[None, :, 0]
        return weights.sum(1)

    @staticmethod
    def backward(ctx, grad_out):
        means2D, opacities, scales, pixels = ctx.saved_tensors
        s = scales[:, :2]
        d = (pixels[:, None, :] - means2D[None, :, :]) / s[None, :, :]
        w = torch.exp(-0.5 * d.pow(2).sum(-1)) * opacities[None, :, 0]
        gw = grad_out[:, None] * w
        grad_means2D = (gw[:, :, None] * d / s[None]).sum(0)
        grad_opacities = (grad_out[:, None] * w / opacities[None, :, 0]).sum(0)[:, None]
        grad_scales = (gw[:, :, None] * d.pow(2) / s[None]).sum(0)
        return grad_means2D, grad_opacities, grad_scales, None


class GaussianModel(nn.Module):
    def __init__(self, n=4):
        super().__init__()
        self._xyz = nn.Parameter(torch.rand(n, 2))
        self._opacity = nn.Parameter(torch.full((n, 1), 0.5))
        self._scaling = nn.Parameter(torch.full((n, 3), 0.3))

    def render(self, pixels):
        return _RasterizeGaussians.apply(self._xyz, self._opacity, self._scaling, pixels)  # @culprit


def training(gaussians, pixels, gt_image, iterations=2):
    optimizer = torch.optim.Adam(gaussians.parameters(), lr=1e-2)
    for iteration in range(iterations):
        image = gaussians.render(pixels)
        loss = (image - gt_image).abs().mean()
        optimizer.zero_grad()
        loss.backward()  # @saved
        optimizer.step()


torch.manual_seed(0)
gaussians = GaussianModel()
pixels = torch.rand(9, 2)
training(gaussians, pixels, torch.rand(9))
