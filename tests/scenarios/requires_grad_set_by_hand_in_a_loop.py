# The "fix" from a forum for "element 0 of tensors does not require grad": set
# loss.requires_grad = True. Nothing raises, and nothing trains: the loss is an accuracy, cut off
# the model by argmax in a helper. One problem, said once (not once per iteration, and not again
# as the parameters it starves). The loss is gone when the block ends: the backward that did not
# raise says its flag was set by hand.
# expect: graph-cut tensor=loss
# outcome: ok
import torch
from torch import nn


def accuracy_loss(logits, y):
    correct = (logits.argmax(1) == y).float().mean()  # @culprit
    return 1 - correct


def train(model, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
        loss = accuracy_loss(model(x), y)
        loss.requires_grad = True
        opt.zero_grad()
        loss.backward()
        opt.step()


torch.manual_seed(0)
model = nn.Linear(4, 3)
train(model, 3)
