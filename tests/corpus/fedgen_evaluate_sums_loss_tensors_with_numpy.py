# FedGen's server evaluates every user's model and sums the test losses with NumPy. Each user's
# test() computes its loss with grad on (no torch.no_grad()), so the losses require grad, and
# np.sum, which turns each of them into an array, refuses them.
# expect: grad-to-numpy
# outcome: raises RuntimeError
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class User:
    def __init__(self, seed):
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        self.test_x, self.test_y = torch.randn(5, 6), torch.randint(0, 3, (5,))

    def test(self):
        self.model.eval()
        output = self.model(self.test_x)  # @saved
        loss = F.cross_entropy(output, self.test_y)
        test_acc = (torch.argmax(output, dim=1) == self.test_y).sum().item()
        return test_acc, loss, self.test_y.shape[0]


class Server:
    def __init__(self, users):
        self.users = users

    def test(self):
        num_samples, tot_correct, losses = [], [], []
        for c in self.users:
            ct, c_loss, ns = c.test()
            tot_correct.append(ct * 1.0)
            num_samples.append(ns)
            losses.append(c_loss)
        return num_samples, tot_correct, losses

    def evaluate(self):
        test_samples, test_accs, test_losses = self.test()
        glob_acc = np.sum(test_accs) * 1.0 / np.sum(test_samples)
        glob_loss = np.sum([x * y for (x, y) in zip(test_samples, test_losses)]).item() / np.sum(test_samples)  # @culprit
        return glob_acc, glob_loss


server = Server([User(0), User(1)])
server.evaluate()
