# A DeepFool attack class (torchattacks style) perturbs each image of the batch step by step. Every
# step starts with `image.requires_grad = True`, but the previous step rebuilt `image` as
# `torch.clamp(image + r, ...)`, a result of ops that require grad: a non-leaf, whose flag cannot be
# set, so the second step raises.
# expect: nonleaf-requires-grad tensor=image
# outcome: raises RuntimeError
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
                image.requires_grad = True  # @culprit
                output = self.model(image)[0]
                _, pre = torch.max(output, 0)
                if pre != labels[b]:
                    image = torch.clamp(image, min=0, max=1).detach()
                    break
                other = (pre + 1) % output.numel()
                f = output[other] - output[pre]
                w = torch.autograd.grad(f, image)[0]
                r = (abs(f) + 1e-4) * w / (w.norm() ** 2 + 1e-8)
                image = torch.clamp(image + (1 + self.overshoot) * r, min=0, max=1)  # @saved
            images[b:b + 1, :, :, :] = image.detach()
        return images


torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
with torch.no_grad():
    labels = model(torch.rand(2, 3, 2, 2)).argmax(1)
attack = DeepFool(model)
adv_images = attack(torch.rand(2, 3, 2, 2), labels)
