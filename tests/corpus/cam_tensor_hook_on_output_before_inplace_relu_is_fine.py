# pytorch-grad-cam's fix (PR 183) for the same model: the forward hook on the target conv registers a
# tensor hook on its output instead of a full backward hook on the module; the in-place ReLU still
# follows. Fine: the gradient the hook saves equals the one read without the in-place ReLU.
# expect: none
# outcome: ok
import torch
from torch import nn


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        x = self.conv1(x)
        x = self.relu(x)
        x = self.relu(self.conv2(x))
        return self.head(x.mean((2, 3)))


class GradCAM:
    def __init__(self, model, target_layer):
        self.model, self.hook_a, self.hook_g = model, None, None
        target_layer.register_forward_hook(self._hook_a)

    def _hook_a(self, module, input, output):
        self.hook_a = output.detach()
        output.register_hook(self._hook_g)

    def _hook_g(self, grad):
        self.hook_g = grad.detach()

    def __call__(self, scores, class_idx):
        scores[:, class_idx].sum().backward(retain_graph=True)
        weights = self.hook_g.mean((2, 3), keepdim=True)
        return torch.relu((weights * self.hook_a).sum(1))


torch.manual_seed(0)
model = SmallNet().eval()
cam_extractor = GradCAM(model, model.conv1)
scores = model(torch.rand(1, 3, 6, 6))
cam = cam_extractor(scores, scores.argmax().item())
