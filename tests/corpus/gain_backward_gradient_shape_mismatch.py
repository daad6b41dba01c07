# GAIN's attention-guided training computes Grad-CAM inside its forward: hooks on a feature
# layer keep its activations and gradients, and it backpropagates from `grad_logits`, the sum
# of the one-hot-masked logits, with gradient=logits*labels_ohe. The gradient has the logits'
# shape and the tensor is a scalar: backward raises a shape mismatch.
# expect: backward-error tensor=grad_logits
# outcome: raises RuntimeError
from collections import OrderedDict

import torch
from torch import nn
from torch.nn import functional as F


class GAIN(nn.Module):
    def __init__(self, model, grad_layer, num_classes):
        super().__init__()
        self.model = model
        self.grad_layer = grad_layer
        self.num_classes = num_classes
        self.feed_forward_features = None
        self.backward_features = None
        self._register_hooks(grad_layer)
        self.sigma, self.omega = 0.5, 10

    def _register_hooks(self, grad_layer):
        def forward_hook(module, grad_input, grad_output):
            self.feed_forward_features = grad_output

        def backward_hook(module, grad_input, grad_output):
            self.backward_features = grad_output[0]

        for idx, m in self.model.named_modules():
            if idx == grad_layer:
                m.register_forward_hook(forward_hook)
                m.register_full_backward_hook(backward_hook)
                break

    def _to_ohe(self, labels):
        return torch.zeros(labels.size(0), self.num_classes).scatter_(1, labels[:, None], 1)

    def forward(self, images, labels):
        with torch.enable_grad():
            self.model.train(True)
            logits = self.model(images)
            self.model.zero_grad()
            labels_ohe = self._to_ohe(labels)
            gradient = logits * labels_ohe
            grad_logits = (logits * labels_ohe).sum()  # @culprit
            grad_logits.backward(gradient=gradient, retain_graph=True)  # @saved
            self.model.zero_grad()
        backward_features = self.backward_features
        fl = self.feed_forward_features
        weights = backward_features.mean(dim=1, keepdim=True)
        Ac = F.relu(fl * weights)
        scaled_ac = torch.sigmoid(self.omega * (Ac.mean(1, keepdim=True) - self.sigma))
        masked_image = images - images * scaled_ac
        logits_am = self.model(masked_image)
        return logits, logits_am, scaled_ac


torch.manual_seed(0)
backbone = nn.Sequential(OrderedDict(features=nn.Sequential(nn.Linear(6, 6), nn.ReLU()), classifier=nn.Linear(6, 2)))
gain = GAIN(backbone, grad_layer="features", num_classes=2)
optimizer = torch.optim.SGD(gain.parameters(), lr=0.01)
images, labels = torch.randn(4, 6), torch.tensor([0, 1, 1, 0])
logits, logits_am, heatmap = gain(images, labels)
loss = F.cross_entropy(logits, labels) + 0.1 * F.softmax(logits_am, dim=1).gather(1, labels[:, None]).mean()
optimizer.zero_grad()
loss.backward()
optimizer.step()
