# Two stages, each with its own loss; the total is rebuilt as a new tensor from their values "so that
# backward works", with requires_grad=True. Backward runs, but only into that new leaf: neither
# stage, both held by the optimizer, gets a gradient. The backward trains nothing: a graph cut hidden
# by requires_grad=True, said once (with the loss), not again as each parameter it starves.
# expect: graph-cut tensor=loss
# outcome: ok
import torch
from torch import nn


def stage_losses(encoder, decoder, x):
    code = encoder(x)
    sparsity = code.abs().mean()
    reconstruction = nn.functional.mse_loss(decoder(code), x)
    return sparsity, reconstruction


torch.manual_seed(0)
encoder, decoder = nn.Linear(6, 3), nn.Linear(3, 6)
opt = torch.optim.SGD([*encoder.parameters(), *decoder.parameters()], lr=0.1)
for step in range(2):
    l1, l2 = stage_losses(encoder, decoder, torch.randn(4, 6))
    loss = torch.tensor([l1.item(), l2.item()], requires_grad=True).sum()  # @culprit
    opt.zero_grad()
    loss.backward()
    opt.step()
