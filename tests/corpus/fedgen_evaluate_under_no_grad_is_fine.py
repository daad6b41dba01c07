# FedGen's server evaluation as the maintainers changed it: each user's test() runs its forward
# under torch.no_grad(), so the losses summed with NumPy hold no graph. Nothing to report.
# expect: none
# outcome: ok
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
        with torch.no_grad():
            output = self.model(self.test_x)
            loss = F.cross_entropy(output, self.test_y)
        test_acc = (torch.argmax(output, dim=1) == self.test_y).sum().item()
        return test_acc, loss, self.test_y.shape[0]


def evaluate(users):
    results = [u.test() for u in users]
    test_samples = [ns for _, _, ns in results]
    glob_acc = np.sum([ct for ct, _, _ in results]) * 1.0 / np.sum(test_samples)
    glob_loss = np.sum([x * y for x, (_, y, _) in zip(test_samples, results)]).item() / np.sum(test_samples)
    return glob_acc, glob_loss


evaluate([User(0), User(1)])
