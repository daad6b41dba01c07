# Neural Attention Distillation's train_step after the authors' fix for #8: the attention transfer
# losses keep their graph (`criterionAT(activation_s, activation_t) * beta`), so they train the
# student; the teacher, whose activations are the targets, is in no optimizer. Same networks as
# the report's reduction.
# expect: none
# outcome: ok
import torch
from torch import nn
from torch.nn import functional as F


class AT(nn.Module):
    def __init__(self, p):
        super(AT, self).__init__()
        self.p = p

    def forward(self, fm_s, fm_t):
        return F.mse_loss(self.attention_map(fm_s), self.attention_map(fm_t))

    def attention_map(self, fm, eps=1e-6):
        am = torch.pow(torch.abs(fm), self.p)
        am = torch.sum(am, dim=1, keepdim=True)
        norm = torch.norm(am, dim=(2, 3), keepdim=True)
        return torch.div(am, norm + eps)


class WRN(nn.Module):
    def __init__(self, classes=3):
        super().__init__()
        self.block1 = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
        self.block2 = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU())
        self.block3 = nn.Sequential(nn.Conv2d(4, 6, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(6, classes)

    def forward(self, x):
        activation1 = self.block1(x)
        activation2 = self.block2(activation1)
        activation3 = self.block3(activation2)
        return activation1, activation2, activation3, self.fc(activation3.mean(dim=(2, 3)))


class Opt:
    beta1, beta2, beta3 = 500, 1000, 1000
    p = 2.0


def train_step(opt, train_loader, nets, optimizer, criterions, epoch):
    snet = nets['snet']
    tnet = nets['tnet']
    criterionCls = criterions['criterionCls']
    criterionAT = criterions['criterionAT']
    snet.train()
    for idx, (img, target) in enumerate(train_loader, start=1):
        activation1_s, activation2_s, activation3_s, output_s = snet(img)
        activation1_t, activation2_t, activation3_t, _ = tnet(img)
        cls_loss = criterionCls(output_s, target)
        at3_loss = criterionAT(activation3_s, activation3_t) * opt.beta3
        at2_loss = criterionAT(activation2_s, activation2_t) * opt.beta2
        at1_loss = criterionAT(activation1_s, activation1_t) * opt.beta1
        at_loss = at1_loss + at2_loss + at3_loss + cls_loss
        optimizer.zero_grad()
        at_loss.backward()
        optimizer.step()


torch.manual_seed(0)
opt = Opt()
student, teacher = WRN(), WRN()
nets = {'snet': student, 'tnet': teacher}
criterions = {'criterionCls': nn.CrossEntropyLoss(), 'criterionAT': AT(opt.p)}
optimizer = torch.optim.SGD(student.parameters(), lr=0.1, momentum=0.9)
loader = [(torch.randn(2, 3, 6, 6), torch.tensor([0, 2])) for _ in range(2)]
train_step(opt, loader, nets, optimizer, criterions, 0)
