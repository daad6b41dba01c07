# A CAM extractor (torch-cam's shape) hooks its target conv with register_full_backward_hook to read
# the gradient; the model's next step is an `nn.ReLU(inplace=True)`. The full backward hook makes the
# conv's output a view returned by a custom Function, and the in-place ReLU on it is refused.
# expect: view-inplace
# outcome: raises RuntimeError
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
        x = self.conv1(x)  # @saved
        x = self.relu(x)  # @culprit
        x = self.relu(self.conv2(x))
        return self.head(x.mean((2, 3)))


class GradCAM:
    def __init__(self, model, target_layer):
        self.model, self.hook_a, self.hook_g = model, None, None
        target_layer.register_forward_hook(self._hook_a)
        target_layer.register_full_backward_hook(self._hook_g)

    def _hook_a(self, module, input, output):
        self.hook_a = output.detach()

    def _hook_g(self, module, grad_input, grad_output):
        self.hook_g = grad_output[0].detach()

    def __call__(self, scores, class_idx):
        scores[:, class_idx].sum().backward(retain_graph=True)
        weights = self.hook_g.mean((2, 3), keepdim=True)
        return torch.relu((weights * self.hook_a).sum(1))


torch.manual_seed(0)
model = SmallNet().eval()
cam_extractor = GradCAM(model, model.conv1)
scores = model(torch.rand(1, 3, 6, 6))
cam = cam_extractor(scores, scores.argmax().item())
