# SageMaker Debugger's hook registers a gradient hook on every parameter of the model it is
# handed. The report fine-tunes a pretrained ResNet with its feature layers frozen
# (`param.requires_grad = False`), and the hook's register_hook refuses the frozen parameters.
# expect: needs-grad tensor=model.0.weight
# outcome: raises RuntimeError
import torch
from torch import nn


class Hook:
    def __init__(self):
        self.grads = {}

    def _backward_apply(self, module):
        for name, param in module.named_parameters():
            param.register_hook(lambda grad, name=name: self.grads.__setitem__(name, grad.norm()))  # @saved


def build_model(num_classes=3):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    for param in model.parameters():
        param.requires_grad = False  # @culprit
    model.add_module("fc", nn.Linear(4, num_classes))
    return model


torch.manual_seed(0)
model = build_model()
hook = Hook()
hook._backward_apply(model)
outputs = model(torch.randn(2, 3, 6, 6))
nn.functional.cross_entropy(outputs, torch.tensor([0, 2])).backward()
