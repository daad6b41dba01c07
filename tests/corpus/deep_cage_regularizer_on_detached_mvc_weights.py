# Neural Cages (deep_cage): `deform_with_MVC` (common.py) with the line the maintainer later
# removed, `weights = weights.detach()`. The MVC regularizer (losses.MVCRegularizer, negative
# weights penalized) is then computed from weights without history: its term is added to the loss
# and changes no gradient, whatever `mvc_weight` is (the reporter's observation). The 3-D mean
# value coordinates are written as the 2-D coordinates of a polygon cage (the dim == 2 path).
# expect: graph-cut
# outcome: ok
from collections import defaultdict

import torch
from torch import nn


def mean_value_coordinates(query, cage):
    """query (B,N,2), cage (B,P,2) -> weights (B,N,P), unnormalized weights."""
    s = cage.unsqueeze(1) - query.unsqueeze(2)
    r = s.norm(dim=-1)
    s_next = torch.roll(s, -1, dims=2)
    cross = s[..., 0] * s_next[..., 1] - s[..., 1] * s_next[..., 0]
    dot = (s * s_next).sum(-1)
    alpha = torch.atan2(cross, dot)
    tan_half = torch.tan(alpha / 2)
    weights_unnormed = (torch.roll(tan_half, 1, dims=2) + tan_half) / r
    weights = weights_unnormed / weights_unnormed.sum(dim=2, keepdim=True)
    return weights, weights_unnormed


def deform_with_MVC(cage, cage_deformed, query, verbose=False):
    weights, weights_unnormed = mean_value_coordinates(query, cage)
    weights = weights.detach()  # @culprit
    deformed = torch.sum(weights.unsqueeze(-1) * cage_deformed.unsqueeze(1), dim=2)
    if verbose:
        return deformed, weights, weights_unnormed
    return deformed


class MVCRegularizer(nn.Module):
    def __init__(self, alpha=1.0, beta=1.0, threshold=5.0):
        super().__init__()
        self.alpha, self.beta, self.threshold = alpha, beta, threshold

    def forward(self, weights):
        loss = 0
        if self.alpha > 0:
            large_loss = torch.log(torch.nn.functional.relu(weights.abs() - self.threshold) + 1)
            loss += (torch.mean(large_loss)) * self.alpha
        if self.beta > 0:
            neg_loss = torch.nn.functional.relu(-weights)
            neg_loss = neg_loss ** 2
            loss += (torch.mean(neg_loss)) * self.beta
        return loss


class NetworkFull(nn.Module):
    def __init__(self, n_points=6, n_cage=4, code=8):
        super().__init__()
        square = torch.tensor([[-1.0, -1.0], [1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]])
        self.register_buffer("template_vertices", square)
        self.encoder = nn.Sequential(nn.Linear(2 * n_points, code), nn.ReLU())
        self.nc_decoder = nn.Linear(code, 2 * n_cage)
        self.nd_decoder = nn.Linear(2 * code, 2 * n_cage)

    def forward(self, source_shape, target_shape):
        B = source_shape.shape[0]
        shape_code = self.encoder(torch.cat([source_shape, target_shape], dim=0).flatten(1))
        s_code, t_code = torch.split(shape_code, B, dim=0)
        cage = self.template_vertices.expand(B, -1, -1) + 0.3 * self.nc_decoder(s_code).view(B, -1, 2)
        new_cage = cage + 0.3 * self.nd_decoder(torch.cat([s_code, t_code], dim=1)).view(B, -1, 2)
        deformed, weights, weights_unnormed = deform_with_MVC(cage, new_cage, source_shape, verbose=True)
        return {"cage": cage, "new_cage": new_cage, "deformed": deformed, "weight": weights}


class AllLosses(nn.Module):
    def __init__(self, mvc_weight=1.0):
        super().__init__()
        self.loss = defaultdict(float)
        self.mvc_weight = mvc_weight
        self.mvc_reg_loss = MVCRegularizer(threshold=50, beta=1.0, alpha=0.0)

    def forward(self, all_inputs, all_outputs):
        self.loss.clear()
        self.loss["MSE"] += torch.nn.functional.mse_loss(all_outputs["deformed"], all_inputs["target_shape"])
        if self.mvc_weight > 0:
            self.loss["WREG"] += self.mvc_reg_loss(all_outputs["weight"]) * self.mvc_weight
        return self.loss


def train(net, all_losses, batches):
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    for source_shape, target_shape in batches:
        all_outputs = net(source_shape, target_shape)
        losses = all_losses({"target_shape": target_shape}, all_outputs)
        loss_sum = sum(losses.values())
        optimizer.zero_grad()
        loss_sum.backward()
        optimizer.step()


torch.manual_seed(0)
points = torch.tensor([[0.2, 0.1], [-0.5, 0.4], [1.4, 0.2], [0.0, -1.3], [0.6, 0.6], [-1.2, -0.2]])
batches = [(points.expand(2, -1, -1) + 0.05 * torch.randn(2, 6, 2), 1.1 * points.expand(2, -1, -1)) for _ in range(2)]
net = NetworkFull()
train(net, AllLosses(), batches)
