# flatironinstitute/pytorch-finufft#95 (and Dao-AILab/flash-attention#2071 for torch.func.grad): a
# custom autograd.Function written with `forward(ctx, ...)` works with .backward() but not under
# torch.func transforms, which raise until forward and setup_context are split.
# expect: transform-unsupported
# outcome: raises RuntimeError
import torch


class FinufftType1(torch.autograd.Function):
    @staticmethod
    def forward(ctx, points, values, output_shape):  # @culprit
        ctx.save_for_backward(points, values)
        phases = torch.outer(torch.arange(output_shape, dtype=points.dtype), points)
        return (torch.cos(phases) * values).sum(dim=1)

    @staticmethod
    def backward(ctx, grad_output):
        points, values = ctx.saved_tensors
        phases = torch.outer(torch.arange(grad_output.shape[0], dtype=points.dtype), points)
        grad_values = (torch.cos(phases) * grad_output[:, None]).sum(dim=0)
        return None, grad_values, None


def loss_of(values, points):
    return FinufftType1.apply(points, values, 6).pow(2).sum()  # @saved


torch.manual_seed(0)
points, values = torch.rand(8) * 6.28, torch.randn(8)
grad_values = torch.func.grad(loss_of)(values, points)
