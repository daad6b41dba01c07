# mrdbourke/pytorch-deep-learning#397: test_step accumulates the loss inside
# `with torch.inference_mode():`, and the averaging lines were dedented out of the block, so
# `test_loss /= len(data_loader)` changes an inference tensor in place outside inference mode.
# The maintainer: it happens when the lines under the context manager lose their indentation.
# expect: view-inplace tensor=test_loss
# outcome: raises RuntimeError
import torch
from torch import nn


def accuracy_fn(y_true, y_pred):
    return (torch.eq(y_true, y_pred).sum().item() / len(y_pred)) * 100


def test_step(model, data_loader, loss_fn, accuracy_fn):
    test_loss, test_acc = 0, 0
    model.eval()
    with torch.inference_mode():
        for X, y in data_loader:
            test_pred = model(X)
            test_loss += loss_fn(test_pred, y)  # @saved
            test_acc += accuracy_fn(y_true=y, y_pred=test_pred.argmax(dim=1))
    test_loss /= len(data_loader)  # @culprit
    test_acc /= len(data_loader)
    return test_loss, test_acc


torch.manual_seed(0)
model_1 = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))
loader = [(torch.randn(4, 1, 4, 4), torch.randint(0, 3, (4,))) for _ in range(2)]
test_step(model_1, loader, nn.CrossEntropyLoss(), accuracy_fn)
