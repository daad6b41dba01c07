# CSA-CDGAN's training loop (train.py): the generator's total loss adds the discriminator's score of
# the fake change map, but that score is taken as `netd(fake).detach()`, so the adversarial term
# is a constant: the generator step is trained by the L1 term alone. The reporter: "you detach the
# 'pred_fake', so the loss cannot update anything". Generator and discriminator are small linear
# networks on flattened 4x4 image pairs.
# expect: graph-cut
# outcome: ok
import torch
from torch import nn

G_WEIGHT, D_WEIGHT = 1.0, 0.5


def l2_loss(input, target):
    return torch.mean(torch.pow((input - target), 2))


class NetG(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(32, 12), nn.ReLU())
        self.decoder = nn.Sequential(nn.Linear(12, 16), nn.Sigmoid())

    def forward(self, x):
        return self.decoder(self.encoder(x.flatten(1))).view(-1, 1, 4, 4)


class NetD(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1), nn.Sigmoid())

    def forward(self, x):
        return self.net(x.flatten(1)).squeeze(1)


def train(netg, netd, train_dataloader, epochs=1):
    l_con = nn.L1Loss()
    l_bce = nn.BCELoss()
    optimizer_d = torch.optim.Adam(netd.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizer_g = torch.optim.Adam(netg.parameters(), lr=2e-4, betas=(0.5, 0.999))
    for epoch in range(epochs):
        loss_g, loss_d = [], []
        for i, data in enumerate(train_dataloader):
            x1, x2, gt = data
            gt = gt[:, 0, :, :].unsqueeze(1)
            x = torch.cat((x1, x2), 1)
            real_label = torch.ones(size=(x1.shape[0],), dtype=torch.float32)
            fake_label = torch.zeros(size=(x1.shape[0],), dtype=torch.float32)
            fake = netg(x)
            pred_real = netd(gt)
            pred_fake = netd(fake).detach()  # @culprit
            err_d_fake = l_bce(pred_fake, fake_label)
            err_g = l_con(fake, gt)
            err_g_total = G_WEIGHT * err_g + D_WEIGHT * err_d_fake
            pred_fake_ = netd(fake.detach())
            err_d_real = l_bce(pred_real, real_label)
            err_d_fake_ = l_bce(pred_fake_, fake_label)
            err_d_total = (err_d_real + err_d_fake_) * 0.5
            optimizer_g.zero_grad()
            err_g_total.backward(retain_graph=True)
            optimizer_g.step()
            optimizer_d.zero_grad()
            err_d_total.backward()
            optimizer_d.step()
            loss_g.append(err_g_total.item())
            loss_d.append(err_d_total.item())


torch.manual_seed(0)
batches = [(torch.randn(2, 1, 4, 4), torch.randn(2, 1, 4, 4), (torch.rand(2, 3, 4, 4) > 0.5).float()) for _ in range(2)]
netg, netd = NetG(), NetD()
train(netg, netd, batches)
