# pytorch/pytorch#73137 (and #32304, #36463): the first derivative is taken with
# create_graph=True, but the function is linear in x, so the derivative is a constant: autograd
# gives it no history, and the second torch.autograd.grad raises. create_graph=True was given; the
# diagnosis must not ask for it.
# expect: graph-cut tensor=g
# outcome: raises RuntimeError
import torch

x = torch.tensor(1.0, requires_grad=True)
f = 2 * x
g = torch.autograd.grad(f, x, create_graph=True)[0]  # @culprit
g2 = torch.autograd.grad(g, x)[0]
