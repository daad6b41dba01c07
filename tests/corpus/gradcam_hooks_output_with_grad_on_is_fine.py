# torch-cam's GradCAM used as its README shows (frgfm/torch-cam#217, the maintainer's answer): the
# model runs with grad on, the forward hook registers a hook on the target layer's output, and the
# score's backward fills the stored gradient. Nothing to report.
# expect: none
# outcome: ok
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
        self.hook_handles.append(output.register_hook(partial(self._store_grad, idx=0)))

    def __call__(self, class_idx, scores):
        scores[:, class_idx].sum().backward()
        weights = self.hook_g.mean(dim=(2, 3), keepdim=True)
        return torch.relu((weights * self.hook_a).sum(dim=1))


torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
model.eval()
cam_extractor = GradCAM(model, target_layer=model[2])
out = model(torch.randn(1, 3, 6, 6))
activation_map = cam_extractor(out.squeeze(0).argmax().item(), out)
