# StreamVC's FeatureLoss after the fix (commit 6e706c8, "previously both real and fake inputs to
# the feature loss were detached, resulting in no gradients"): only the real features are detached,
# as the target the generator's features are pulled to; the discriminator is trained by its own step.
# Same train loop and networks as the report's reduction.
# expect: none
# outcome: ok
import torch
from torch import nn


def masked_mean_from_ratios(x, mask_ratio):
    return (x * mask_ratio).mean()


class FeatureLoss(nn.Module):
    def __init__(self, n_blocks=2, n_features=4, n_layers=2):
        super().__init__()
        self.n_blocks = n_blocks
        self.n_features = n_features
        self.n_layers = n_layers

    def forward(self, real, fake, mask_ratio):
        loss = torch.tensor(0., device=real[0][0].device, dtype=real[0][0].dtype)
        feature_weights = 4.0 / (self.n_layers + 1)
        discriminator_weights = 1.0 / self.n_blocks
        wt = discriminator_weights * feature_weights
        for i in range(self.n_blocks):
            for j in range(len(fake[i]) - 1):
                loss += wt * masked_mean_from_ratios(torch.abs(fake[i][j] - real[i][j].detach()), mask_ratio)
        return loss


class GeneratorLoss(nn.Module):
    def forward(self, fake, mask_ratio):
        return sum(masked_mean_from_ratios(torch.relu(1 - block[-1]), mask_ratio) for block in fake) / len(fake)


class DiscriminatorLoss(nn.Module):
    def forward(self, real, fake, mask_ratio):
        return sum(masked_mean_from_ratios(torch.relu(1 - r[-1]) + torch.relu(1 + f[-1]), mask_ratio)
                   for r, f in zip(real, fake)) / len(real)


class ReconstructionLoss(nn.Module):
    def forward(self, x, y, mask_ratio):
        return masked_mean_from_ratios((x - y).abs(), mask_ratio)


class Discriminator(nn.Module):
    def __init__(self, n_blocks=2):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleList([nn.Linear(8, 4), nn.Linear(4, 4), nn.Linear(4, 1)]) for _ in range(n_blocks))

    def forward(self, x):
        outputs = []
        for block in self.blocks:
            features, h = [], x
            for layer in block[:-1]:
                h = torch.tanh(layer(h))
                features.append(h)
            features.append(block[-1](h))
            outputs.append(features)
        return outputs


def train(generator, discriminator, batches, lambda_adversarial=1, lambda_feature=100, lambda_reconstruction=1):
    optimizer_generator = torch.optim.AdamW(generator.parameters(), lr=1e-3)
    optimizer_discriminator = torch.optim.AdamW(discriminator.parameters(), lr=1e-3)
    generator_loss_fn, discriminator_loss_fn = GeneratorLoss(), DiscriminatorLoss()
    feature_loss_fn, reconstruction_loss_fn = FeatureLoss(), ReconstructionLoss()
    for batch, mask_ratio in batches:
        x_pred_t = generator(batch)
        optimizer_discriminator.zero_grad()
        discriminator_fake_detached = discriminator(x_pred_t.detach())
        discriminator_real = discriminator(batch)
        discriminator_loss = discriminator_loss_fn(discriminator_real, discriminator_fake_detached, mask_ratio)
        discriminator_loss.backward()
        optimizer_discriminator.step()
        optimizer_generator.zero_grad()
        discriminator_fake = discriminator(x_pred_t)
        discriminator_real = discriminator(batch)
        adversarial_loss = generator_loss_fn(discriminator_fake, mask_ratio)
        feature_loss = feature_loss_fn(discriminator_real, discriminator_fake, mask_ratio)
        reconstruction_loss = reconstruction_loss_fn(batch, x_pred_t, mask_ratio)
        losses = (lambda_adversarial * adversarial_loss + lambda_feature * feature_loss +
                  lambda_reconstruction * reconstruction_loss)
        losses.backward()
        optimizer_generator.step()


torch.manual_seed(0)
generator, discriminator = nn.Linear(8, 8), Discriminator()
train(generator, discriminator, [(torch.randn(3, 8), torch.ones(3, 1)) for _ in range(2)])
