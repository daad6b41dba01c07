# The corrected weight-noise loop from the same forum thread: before the forward, each parameter's
# `.data` is replaced by a noisy copy (the clean values kept in a list); after `loss.backward()` the
# clean values are assigned back to `.data` and the optimizer steps. Both swaps happen outside the
# life of any graph. Fine: no error, gradients taken at the noisy weights.
# expect: none
# outcome: ok
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(5, 4)
        self.fc2 = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def train(model, optimizer, steps=2):
    model.train()
    for _ in range(steps):
        orig_params = []
        for p in model.parameters():
            orig_params.append(p.clone())
            p.data = p.data + torch.randn_like(p)
        inputs, labels = torch.randn(6, 5), torch.tensor([0, 1, 2, 0, 1, 2])
        output = model(inputs)
        loss = nn.CrossEntropyLoss()(output, labels)
        optimizer.zero_grad()
        loss.backward()
        for orig_p, p in zip(orig_params, model.parameters()):
            p.data = orig_p.data
        optimizer.step()


torch.manual_seed(0)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
train(model, optimizer)
