# Truncated backpropagation through time with a window: the state is detached every 4 steps,
# and within a window each step's backward keeps the graph for the next one. The history that
# backward runs again is bounded by the window: it does not grow with the sequence.
# expect: none
# outcome: ok
import torch
from torch import nn


def run_sequence(cell, head, opt, xs, window=4):
    h = torch.zeros(1, 4)
    for t, x in enumerate(xs):
        if t % window == 0:
            h = h.detach()
            opt.zero_grad()
        h = cell(x, h)
        loss = head(h).pow(2).mean()
        loss.backward(retain_graph=(t % window) != window - 1)
        if t % window == window - 1:
            opt.step()
    return h


torch.manual_seed(0)
cell, head = nn.RNNCell(2, 4), nn.Linear(4, 1)
opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.05)
run_sequence(cell, head, opt, [torch.randn(1, 2) for _ in range(12)])
