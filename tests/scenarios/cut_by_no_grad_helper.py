# A helper computes the prediction under torch.no_grad() (it was written for evaluation) and is
# reused for training: the loss has no path to the weights.
# expect: graph-cut tensor=loss
# outcome: raises RuntimeError
import torch
from torch import nn


def predict(model, x):
    with torch.no_grad():
        return model(x)  # @culprit


torch.manual_seed(0)
model = nn.Linear(4, 1)
x, y = torch.randn(6, 4), torch.randn(6, 1)
loss = nn.functional.mse_loss(predict(model, x), y)
loss.backward()
