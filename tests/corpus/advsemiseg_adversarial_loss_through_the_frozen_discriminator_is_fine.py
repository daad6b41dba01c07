# AdvSemiSeg's train.py (the question in #2): while the segmentation network is trained, the
# discriminator's parameters are set to requires_grad=False, and `loss_adv_pred` still trains the
# segmentation network through the discriminator; the discriminator then scores `pred.detach()` in
# its own step. A 1x1-conv segmentation net with 3 classes and a 1x1-conv discriminator on 4x4 maps.
# expect: none
# outcome: ok
import torch
from torch import nn
from torch.nn import functional as F


def make_D_label(label, shape):
    return torch.full(shape, float(label))


def train(model, model_D, batches, lambda_adv_pred=0.01):
    optimizer = torch.optim.SGD(model.parameters(), lr=2.5e-4, momentum=0.9)
    optimizer_D = torch.optim.Adam(model_D.parameters(), lr=1e-4, betas=(0.9, 0.99))
    bce_loss = nn.BCEWithLogitsLoss()
    pred_label, gt_label = 0, 1
    for images, labels in batches:
        optimizer.zero_grad()
        optimizer_D.zero_grad()
        for param in model_D.parameters():
            param.requires_grad = False
        pred = model(images)
        loss_seg = F.cross_entropy(pred, labels)
        D_out = model_D(F.softmax(pred, dim=1))
        loss_adv_pred = bce_loss(D_out, make_D_label(gt_label, D_out.shape))
        loss = loss_seg + lambda_adv_pred * loss_adv_pred
        loss.backward()
        for param in model_D.parameters():
            param.requires_grad = True
        pred = pred.detach()
        D_out = model_D(F.softmax(pred, dim=1))
        loss_D = bce_loss(D_out, make_D_label(pred_label, D_out.shape)) / 2
        loss_D.backward()
        D_gt_v = F.one_hot(labels, 3).permute(0, 3, 1, 2).float()
        D_out = model_D(D_gt_v)
        loss_D = bce_loss(D_out, make_D_label(gt_label, D_out.shape)) / 2
        loss_D.backward()
        optimizer.step()
        optimizer_D.step()


torch.manual_seed(0)
model, model_D = nn.Conv2d(3, 3, 1), nn.Sequential(nn.Conv2d(3, 4, 1), nn.LeakyReLU(0.2), nn.Conv2d(4, 1, 1))
train(model, model_D, [(torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4))) for _ in range(2)])
