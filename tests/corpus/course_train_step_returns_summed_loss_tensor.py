# The zero-to-mastery course's train_step/train functions with the `.item()` left out: train_step
# adds each batch's loss tensor to `train_loss` and returns its average, and train appends it to
# results["train_loss"] every epoch, so each epoch's total chains all its batches' graphs.
# expect: accumulated-graph tensor=train_loss
# outcome: ok
import torch
from torch import nn


def train_step(model, dataloader, loss_fn, optimizer):
    model.train()
    train_loss, train_acc = 0, 0
    for batch, (X, y) in enumerate(dataloader):
        y_pred = model(X)
        loss = loss_fn(y_pred, y)
        train_loss += loss  # @culprit
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        y_pred_class = torch.argmax(torch.softmax(y_pred, dim=1), dim=1)
        train_acc += (y_pred_class == y).sum().item() / len(y_pred)
    train_loss = train_loss / len(dataloader)
    train_acc = train_acc / len(dataloader)
    return train_loss, train_acc


def train(model, train_dataloader, optimizer, loss_fn=nn.CrossEntropyLoss(), epochs=2):
    results = {"train_loss": [], "train_acc": []}
    for epoch in range(epochs):
        train_loss, train_acc = train_step(model, train_dataloader, loss_fn, optimizer)
        results["train_loss"].append(train_loss)
        results["train_acc"].append(train_acc)
    return results


class TinyVGG(nn.Module):
    def __init__(self, input_shape=3, hidden_units=4, output_shape=3):
        super().__init__()
        self.conv_block_1 = nn.Sequential(nn.Conv2d(input_shape, hidden_units, 3, padding=1), nn.ReLU(),
                                          nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(hidden_units * 2 * 2, output_shape))

    def forward(self, x):
        return self.classifier(self.conv_block_1(x))


torch.manual_seed(0)
model_0 = TinyVGG()
loader = [(torch.randn(2, 3, 4, 4), torch.tensor([0, 2])) for _ in range(3)]
model_0_results = train(model_0, loader, torch.optim.Adam(model_0.parameters(), lr=1e-3))
