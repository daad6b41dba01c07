# Adversarial training with a PGD attack: the first step makes x_adv from the previous x_adv and
# its gradient, so in the next iteration x_adv is not a leaf, and setting requires_grad raises
# "you can only change requires_grad flags of leaf variables".
# expect: nonleaf-requires-grad tensor=x_adv
# outcome: raises RuntimeError
import torch
from torch import nn
import torch.nn.functional as F


def pgd(model, x, y, eps=0.1, alpha=0.03, steps=3):
    x_adv = x.clone()
    for _ in range(steps):
        x_adv.requires_grad = True  # @culprit
        loss = F.cross_entropy(model(x_adv), y)
        grad, = torch.autograd.grad(loss, x_adv)
        x_adv = x_adv + alpha * grad.sign()
        x_adv = torch.min(torch.max(x_adv, x - eps), x + eps)  # @saved
    return x_adv


def adversarial_step(model, opt, x, y):
    x_adv = pgd(model, x, y)
    loss = F.cross_entropy(model(x_adv), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
adversarial_step(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(6, 4), torch.randint(0, 3, (6,)))
