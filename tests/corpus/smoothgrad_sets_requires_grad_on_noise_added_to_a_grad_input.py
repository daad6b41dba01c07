# TensorWatch-style saliency: `get_image_saliency_results` runs several explainers on one input.
# The first one's `_backprop` sets `inp.requires_grad = True` on the input itself; SmoothGrad then
# builds `noisy_inp = inp + noise` from that input, a non-leaf, and hands it to the same `_backprop`,
# whose `requires_grad = True` raises.
# expect: nonleaf-requires-grad
# outcome: raises RuntimeError
import torch
from torch import nn


class VanillaGradExplainer:
    def __init__(self, model):
        self.model = model

    def _backprop(self, inp, ind):
        inp.requires_grad = True  # @culprit
        if inp.grad is not None:
            inp.grad.zero_()
        output = self.model(inp)
        if ind is None:
            ind = output.max(1)[1]
        grad_out = output.clone().zero_()
        grad_out.scatter_(1, ind.unsqueeze(0).t(), 1.0)
        output.backward(grad_out)
        return inp.grad

    def explain(self, inp, ind=None):
        return self._backprop(inp, ind)


class SmoothGradExplainer:
    def __init__(self, model, stdev_spread=0.15, nsamples=2):
        self.base_explainer = VanillaGradExplainer(model)
        self.stdev_spread = stdev_spread
        self.nsamples = nsamples

    def explain(self, inp, ind=None):
        stdev = self.stdev_spread * (inp.max() - inp.min())
        total_gradients = 0
        for _ in range(self.nsamples):
            noise = torch.randn_like(inp) * stdev
            noisy_inp = inp + noise  # @saved
            grad = self.base_explainer.explain(noisy_inp, ind)
            total_gradients = total_gradients + grad
        return total_gradients / self.nsamples


def get_saliency(model, inp, label, method):
    explainer = {"vanilla_grad": VanillaGradExplainer, "smooth_grad": SmoothGradExplainer}[method](model)
    return explainer.explain(inp, label)


def get_image_saliency_results(model, input_tensor, prediction_tensor, methods):
    return {method: get_saliency(model, input_tensor, prediction_tensor, method) for method in methods}


torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
input_tensor = torch.rand(1, 3, 2, 2)
results = get_image_saliency_results(model, input_tensor, torch.tensor([1]), ["vanilla_grad", "smooth_grad"])
