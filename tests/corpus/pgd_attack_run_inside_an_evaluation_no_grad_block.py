# BorealisAI/advertorch#79: the test loop runs under `with torch.no_grad():` and calls the
# attack's perturb() inside it; the attack's loss is computed with grad off, and its backward
# raises. The maintainer's answer: the no_grad block around the attack is the cause.
# expect: graph-cut tensor=loss
# outcome: raises RuntimeError
import torch
from torch import nn


class LinfPGDAttack:
    def __init__(self, predict, eps=0.3, nb_iter=2, eps_iter=0.1):
        self.predict, self.eps, self.nb_iter, self.eps_iter = predict, eps, nb_iter, eps_iter
        self.loss_fn = nn.CrossEntropyLoss(reduction="sum")

    def perturb(self, x, y):
        delta = torch.zeros_like(x).uniform_(-self.eps, self.eps).requires_grad_()
        for _ in range(self.nb_iter):
            outputs = self.predict(x + delta)
            loss = self.loss_fn(outputs, y)
            loss.backward()
            delta.data = (delta.data + self.eps_iter * delta.grad.sign()).clamp(-self.eps, self.eps)
            delta.grad.zero_()
        return (x + delta).detach()


def test(net, adversary, testloader):
    net.eval()
    with torch.no_grad():  # @culprit
        for inputs, targets in testloader:
            adv_untargeted = adversary.perturb(inputs, targets)
            outputs = net(adv_untargeted)


torch.manual_seed(0)
net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
test(net, LinfPGDAttack(net), [(torch.randn(4, 6), torch.tensor([0, 1, 2, 0]))])
