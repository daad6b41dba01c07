# pix2pixHD's Pix2PixHDModel.forward and train.py loop (the question in #237): the generator's
# feature-matching loss compares the discriminator's features of the fake image with
# `pred_real[i][j].detach()`, and the discriminator is trained by its own step on a detached fake
# from the pool. One discriminator scale with two layers, a linear generator on 8-pixel images.
# expect: none
# outcome: ok
import torch
from torch import nn


class GANLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.loss = nn.MSELoss()

    def __call__(self, input, target_is_real):
        pred = input[-1]
        return self.loss(pred, torch.full_like(pred, 1.0 if target_is_real else 0.0))


class NLayerDiscriminator(nn.Module):
    def __init__(self, input_nc=12):
        super().__init__()
        self.model0 = nn.Sequential(nn.Linear(input_nc, 8), nn.LeakyReLU(0.2))
        self.model1 = nn.Sequential(nn.Linear(8, 8), nn.LeakyReLU(0.2))
        self.model2 = nn.Linear(8, 1)

    def forward(self, input):
        res = [input]
        for n in range(3):
            res.append(getattr(self, 'model' + str(n))(res[-1]))
        return res[1:]


class Pix2PixHDModel(nn.Module):
    def __init__(self, n_layers_D=2, num_D=1, lambda_feat=10.0):
        super().__init__()
        self.netG = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh())
        self.netD = NLayerDiscriminator()
        self.criterionGAN, self.criterionFeat = GANLoss(), nn.L1Loss()
        self.n_layers_D, self.num_D, self.lambda_feat = n_layers_D, num_D, lambda_feat

    def discriminate(self, input_label, test_image, use_pool=False):
        input_concat = torch.cat((input_label, test_image.detach()), dim=1)
        return [self.netD(input_concat)]

    def forward(self, label, image):
        fake_image = self.netG(label)
        pred_fake_pool = self.discriminate(label, fake_image, use_pool=True)
        loss_D_fake = self.criterionGAN(pred_fake_pool[0], False)
        pred_real = self.discriminate(label, image)
        loss_D_real = self.criterionGAN(pred_real[0], True)
        pred_fake = [self.netD(torch.cat((label, fake_image), dim=1))]
        loss_G_GAN = self.criterionGAN(pred_fake[0], True)
        loss_G_GAN_Feat = 0
        feat_weights = 4.0 / (self.n_layers_D + 1)
        D_weights = 1.0 / self.num_D
        for i in range(self.num_D):
            for j in range(len(pred_fake[i]) - 1):
                loss_G_GAN_Feat += D_weights * feat_weights * \
                    self.criterionFeat(pred_fake[i][j], pred_real[i][j].detach()) * self.lambda_feat
        return [loss_G_GAN, loss_G_GAN_Feat, loss_D_real, loss_D_fake], fake_image


torch.manual_seed(0)
model = Pix2PixHDModel()
optimizer_G = torch.optim.Adam(model.netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizer_D = torch.optim.Adam(model.netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
for label, real_image in [(torch.randn(2, 4), torch.rand(2, 8) * 2 - 1) for _ in range(2)]:
    losses, generated = model(label, real_image)
    loss_dict = dict(zip(['G_GAN', 'G_GAN_Feat', 'D_real', 'D_fake'], losses))
    loss_D = (loss_dict['D_fake'] + loss_dict['D_real']) * 0.5
    loss_G = loss_dict['G_GAN'] + loss_dict['G_GAN_Feat']
    optimizer_G.zero_grad()
    loss_G.backward()
    optimizer_G.step()
    optimizer_D.zero_grad()
    loss_D.backward()
    optimizer_D.step()
