# torch-cam's gradient-based CAM extractors register a hook on the target layer's output from a
# forward hook, to keep its gradient. The report runs the model under `with torch.no_grad():` to
# test it, so the layer's output does not require grad and register_hook refuses it.
# expect: needs-grad
# outcome: raises RuntimeError
from functools import partial

import torch
from torch import nn


class GradCAM:
    def __init__(self, model, target_layer):
        self.hook_a, self.hook_g, self.hook_handles = None, None, []
        self.hook_handles.append(target_layer.register_forward_hook(self._hook_a))
        self.hook_handles.append(target_layer.register_forward_hook(self._hook_g))

    def _hook_a(self, module, input, output):
        self.hook_a = output.data

    def _store_grad(self, grad, idx=0):
        self.hook_g = grad.data

    def _hook_g(self, module, input, output):
        self.hook_handles.append(output.register_hook(partial(self._store_grad, idx=0)))  # @saved


torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
model.eval()
cam_extractor = GradCAM(model, target_layer=model[2])
input = torch.randn(1, 3, 6, 6)
with torch.no_grad():
    output = model(input)  # @culprit
