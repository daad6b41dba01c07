# The same DeepFool attack after the maintainer's fix: each step's new image is
# `torch.clamp(image + r, ...).detach()`, a leaf again, so setting its requires_grad flag at the next
# step is allowed. Fine: the attack runs to the end.
# expect: none
# outcome: ok
import torch
from torch import nn


class Attack:
    def __init__(self, name, model):
        self.attack = name
        self.model = model

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


class DeepFool(Attack):
    def __init__(self, model, steps=3, overshoot=0.02):
        super().__init__("DeepFool", model)
        self.steps = steps
        self.overshoot = overshoot

    def forward(self, images, labels):
        images = images.clone()
        for b in range(images.shape[0]):
            image = images[b:b + 1, :, :, :]
            for i in range(self.steps):
                image.requires_grad = True
                output = self.model(image)[0]
                _, pre = torch.max(output, 0)
                if pre != labels[b]:
                    image = torch.clamp(image, min=0, max=1).detach()
                    break
                other = (pre + 1) % output.numel()
                f = output[other] - output[pre]
                w = torch.autograd.grad(f, image)[0]
                r = (abs(f) + 1e-4) * w / (w.norm() ** 2 + 1e-8)
                image = torch.clamp(image + (1 + self.overshoot) * r, min=0, max=1).detach()
            images[b:b + 1, :, :, :] = image.detach()
        return images


torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
with torch.no_grad():
    labels = model(torch.rand(2, 3, 2, 2)).argmax(1)
attack = DeepFool(model)
adv_images = attack(torch.rand(2, 3, 2, 2), labels)
