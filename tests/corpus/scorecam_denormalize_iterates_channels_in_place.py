# Score-CAM's visualisation helpers (copied from flashtorch): `apply_transforms` hands back the image
# with requires_grad set, and `basic_visualize` calls `denormalize`, which clones it and loops
# `for channel, ... in zip(denormalized[0], ...)`: iterating a tensor unbinds it, and
# `channel.mul_(std)` writes one of several views of one unbind, which PyTorch refuses.
# expect: view-inplace
# outcome: raises RuntimeError
import torch
import torch.nn.functional as F
from torch import nn


def apply_transforms(image, size=8):
    means = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    stds = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    tensor = ((F.interpolate(image.unsqueeze(0), size=size) - means) / stds)
    tensor.requires_grad = True
    return tensor


def denormalize(tensor):
    means = [0.485, 0.456, 0.406]
    stds = [0.229, 0.224, 0.225]
    denormalized = tensor.clone()
    for channel, mean, std in zip(denormalized[0], means, stds):  # @saved
        channel.mul_(std).add_(mean)  # @culprit
    return denormalized


def format_for_plotting(tensor):
    return tensor.squeeze(0).permute(1, 2, 0).detach()


def basic_visualize(input_, gradients):
    input_ = format_for_plotting(denormalize(input_))
    return input_ * gradients.squeeze(0).unsqueeze(-1)


class ScoreCAM:
    def __init__(self, model, target_layer):
        self.model, self.activations = model, {}
        target_layer.register_forward_hook(lambda m, i, o: self.activations.__setitem__('value', o))

    def __call__(self, input_):
        logit = self.model(input_)
        score = logit[:, logit.argmax()]
        activations = self.activations['value']
        with torch.no_grad():
            saliency = torch.zeros(1, 1, *input_.shape[2:])
            for k in range(activations.shape[1]):
                mask = F.interpolate(activations[:, k:k + 1], size=input_.shape[2:], mode='bilinear')
                if mask.max() == mask.min():
                    continue
                norm_mask = (mask - mask.min()) / (mask.max() - mask.min())
                saliency += F.softmax(self.model(input_ * norm_mask), dim=1)[0, logit.argmax()] * mask
            saliency = F.relu(saliency)
        return (saliency - saliency.min()) / (saliency.max() - saliency.min() + 1e-8), score


torch.manual_seed(0)
features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
model = nn.Sequential(features, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5))
model.eval()
input_ = apply_transforms(torch.rand(3, 10, 10))
scorecam_map, score = ScoreCAM(model, features)(input_)
visual = basic_visualize(input_.cpu(), scorecam_map.type(torch.FloatTensor).cpu())
