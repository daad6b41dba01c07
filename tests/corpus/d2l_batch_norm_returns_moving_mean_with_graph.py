# d2l's from-scratch batch normalization before its PR 1342: `batch_norm` computes
# `moving_mean = momentum * moving_mean + (1.0 - momentum) * mean` from the batch's mean, which carries
# the graph, and the module stores the result back on itself (`self.moving_mean`, a plain attribute).
# Each step's moving mean holds the previous one and that step's graph: the chain grows every step.
# The tensor goes by the name the culprit line writes, `moving_mean` (the module keeps the result
# on `self.moving_mean`, a plain attribute, through a tuple assignment in its forward).
# expect: accumulated-graph tensor=moving_mean
# outcome: ok
import torch
from torch import nn


def batch_norm(X, gamma, beta, moving_mean, moving_var, eps, momentum):
    if not torch.is_grad_enabled():
        X_hat = (X - moving_mean) / torch.sqrt(moving_var + eps)
    else:
        assert len(X.shape) in (2, 4)
        if len(X.shape) == 2:
            mean = X.mean(dim=0)
            var = ((X - mean) ** 2).mean(dim=0)
        else:
            mean = X.mean(dim=(0, 2, 3), keepdim=True)
            var = ((X - mean) ** 2).mean(dim=(0, 2, 3), keepdim=True)
        X_hat = (X - mean) / torch.sqrt(var + eps)
        moving_mean = momentum * moving_mean + (1.0 - momentum) * mean  # @culprit
        moving_var = momentum * moving_var + (1.0 - momentum) * var
    Y = gamma * X_hat + beta
    return Y, moving_mean, moving_var


class BatchNorm(nn.Module):
    def __init__(self, num_features, num_dims):
        super().__init__()
        shape = (1, num_features) if num_dims == 2 else (1, num_features, 1, 1)
        self.gamma = nn.Parameter(torch.ones(shape))
        self.beta = nn.Parameter(torch.zeros(shape))
        self.moving_mean = torch.zeros(shape)
        self.moving_var = torch.ones(shape)

    def forward(self, X):
        if self.moving_mean.device != X.device:
            self.moving_mean = self.moving_mean.to(X.device)
            self.moving_var = self.moving_var.to(X.device)
        Y, self.moving_mean, self.moving_var = batch_norm(
            X, self.gamma, self.beta, self.moving_mean, self.moving_var, eps=1e-5, momentum=0.9)
        return Y


def train_epoch(net, train_iter, loss, updater):
    net.train()
    for X, y in train_iter:
        l = loss(net(X), y)
        updater.zero_grad()
        l.mean().backward()
        updater.step()


torch.manual_seed(0)
net = nn.Sequential(nn.Linear(6, 8), BatchNorm(8, num_dims=2), nn.Sigmoid(), nn.Linear(8, 3))
train_iter = [(torch.randn(4, 6), torch.randint(0, 3, (4,))) for _ in range(3)]
train_epoch(net, train_iter, nn.CrossEntropyLoss(reduction='none'), torch.optim.SGD(net.parameters(), lr=0.5))
