# FL-MRCM's local update (models/recon_Update.py) as reported: the reconstruction network's
# adversarial term is turned into a Python number (`loss_adv_g.detach().item()`, written against a
# memory leak) before it is added to the L1 loss, so it trains nothing; the author: "detach() should
# take place in the next line (in the append())". The reconstruction net and the feature
# discriminator are small linear networks.
# expect: graph-cut
# outcome: ok
import numpy as np
import torch
from torch import nn


class ReconNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
        self.dec = nn.Linear(4, 8)

    def forward(self, x):
        z = self.enc(x)
        return self.dec(z), z


class LocalUpdate:
    def __init__(self, flag=False):
        self.flag = flag
        self.loss_func = nn.L1Loss()
        self.adv_loss = nn.BCEWithLogitsLoss()

    def set_requires_grad(self, net, requires_grad):
        for param in net.parameters():
            param.requires_grad = requires_grad

    def train(self, net, net_fd, batches, batches_t):
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
        optimizer_fd = torch.optim.Adam(net_fd.parameters(), lr=1e-3)
        batch_loss_adv_g, batch_loss = [], []
        for (input, target), (input_t, target_t) in zip(batches, batches_t):
            net.zero_grad()
            net_fd.zero_grad()
            output, z = net(input)
            output_t, z_t = net(input_t)
            src_domain_code = torch.FloatTensor(np.repeat(np.array([[1, 0]]), input.shape[0], axis=0))
            tgt_domain_code = torch.FloatTensor(np.repeat(np.array([[0, 1]]), input_t.shape[0], axis=0))
            if not self.flag:
                self.set_requires_grad(net_fd, True)
                src_domain_pred = net_fd(z.detach())
                tgt_domain_pred = net_fd(z_t.detach())
                df_loss_src = self.adv_loss(src_domain_pred, 1 - src_domain_code)
                df_loss_tgt = self.adv_loss(tgt_domain_pred, 1 - tgt_domain_code)
                df_loss = ((df_loss_src + df_loss_tgt) / 2)
                df_loss.backward()
                optimizer_fd.step()
                df_loss = df_loss.detach().item()
            self.set_requires_grad(net_fd, False)
            loss_adv_g = 0
            if not self.flag:
                src_domain_pred = net_fd(z)
                tgt_domain_pred = net_fd(z_t)
                df_loss_src = self.adv_loss(src_domain_pred, src_domain_code)
                df_loss_tgt = self.adv_loss(tgt_domain_pred, tgt_domain_code)
                loss_adv_g = ((df_loss_src + df_loss_tgt) / 2)
                loss_adv_g = loss_adv_g.detach().item()  # @culprit
            batch_loss_adv_g.append(loss_adv_g)
            L1_loss = self.loss_func(output, target)
            if not self.flag:
                loss = L1_loss + loss_adv_g
            else:
                loss = L1_loss
            batch_loss.append(loss.detach().item())
            loss.backward()
            optimizer.step()


torch.manual_seed(0)
data = [(torch.randn(3, 8), torch.randn(3, 8)) for _ in range(2)]
data_t = [(torch.randn(3, 8) + 1, torch.randn(3, 8)) for _ in range(2)]
net, net_fd = ReconNet(), nn.Linear(4, 2)
LocalUpdate().train(net, net_fd, data, data_t)
