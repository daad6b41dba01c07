# Score-CAM's visualisation helpers with the fix posted in its issue 28: `denormalize` still clones
# the image that requires grad, but writes each channel back by index (`denormalized[0][count] =
# denormalized[0][count].mul(std)`) instead of writing the views an iteration over the tensor made.
# Fine: an indexed write into a clone, whose old value no node needs.
# expect: none
# outcome: ok
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
    count = 0
    for channel, mean, std in zip(denormalized[0], means, stds):
        denormalized[0][count] = denormalized[0][count].mul(std)
        denormalized[0][count] = denormalized[0][count].add(mean)
        count += 1
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
