# PingoLH/FCHarDNet#61: a test script transplants pretrained kernels into a model's conv by
# writing a view of its weight, `cconv.weight[:,:,:,:] = W[:,:,:,:]`. The weight is a leaf that
# requires grad, and PyTorch refuses the in-place write to it outside torch.no_grad().
# expect: leaf-inplace tensor=model.0.weight
# outcome: raises RuntimeError
import torch
from torch import nn


def transplant(model, kernels):
    for cconv, W in zip([m for m in model.modules() if isinstance(m, nn.Conv2d)], kernels):
        cconv.weight[:, :, :, :] = W[:, :, :, :]  # @culprit


torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 1))
kernels = [torch.randn(4, 3, 3, 3), torch.randn(2, 4, 1, 1)]
transplant(model, kernels)
