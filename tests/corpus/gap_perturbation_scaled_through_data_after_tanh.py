# Generative Adversarial Perturbations (issue 4): the generator ends in Tanh, and normalize_and_scale
# shifts, normalizes and clips its output through `.data` (`delta_im.data += 1`, per-channel and
# per-image writes) before it is added to the image. Tanh saved that very output for its backward,
# so the generator is trained with 1 - y^2 of the rescaled values: no error, wrong gradients.
# expect: silent-data-mutation tensor=delta_im
# outcome: wrong-grad
import torch
import torch.nn as nn

mean_arr = [0.485, 0.456, 0.406]
stddev_arr = [0.229, 0.224, 0.225]
mag_in = 10.0


class ResnetGenerator(nn.Module):
    def __init__(self, ngf=4):
        super().__init__()
        self.model = nn.Sequential(nn.Conv2d(3, ngf, 3, padding=1), nn.ReLU(True),
                                   nn.Conv2d(ngf, 3, 3, padding=1), nn.Tanh())

    def forward(self, input):
        return self.model(input)  # @saved


def normalize_and_scale(delta_im, bs):
    delta_im.data += 1  # @culprit
    delta_im.data *= 0.5
    for c in range(3):
        delta_im.data[:, c, :, :] = (delta_im.data[:, c, :, :] - mean_arr[c]) / stddev_arr[c]
    for i in range(bs):
        for ci in range(3):
            l_inf_channel = delta_im[i, ci, :, :].data.abs().max()
            mag_in_scaled_c = mag_in / (255.0 * stddev_arr[ci])
            delta_im[i, ci, :, :].data *= torch.clamp(mag_in_scaled_c / l_inf_channel, max=1.0)
    return delta_im


def train(netG, pretrained_clf, optimizerG, batches, batch_size):
    netG.train()
    for image, _ in batches:
        pretrained_label_float = pretrained_clf(image)
        _, target_label = torch.min(pretrained_label_float, 1)
        delta_im = netG(image)
        delta_im = normalize_and_scale(delta_im, batch_size)
        netG.zero_grad()
        recons = torch.add(image, delta_im)
        for cii in range(3):
            recons.data[:, cii, :, :] = recons.data[:, cii, :, :].clamp(image.data[:, cii, :, :].min(), image.data[:, cii, :, :].max())
        output_pretrained = pretrained_clf(recons)
        loss = torch.log(nn.CrossEntropyLoss()(output_pretrained, target_label))
        loss.backward()
        optimizerG.step()


torch.manual_seed(0)
netG = ResnetGenerator()
pretrained_clf = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5))
for p in pretrained_clf.parameters():
    p.requires_grad = False
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4)
batch_size = 2
batches = [(torch.randn(batch_size, 3, 6, 6), torch.zeros(batch_size, dtype=torch.long))]
train(netG, pretrained_clf, optimizerG, batches, batch_size)
