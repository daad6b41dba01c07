# Weight-noise training: each noisy layer's forward swaps noisy values into `linear.weight.data`,
# runs the linear and assigns the clean values back to `.data` before returning. The second layer's
# linear saved its weight for the first layer's gradient, but as `weight.t()`, a view that keeps the
# noisy storage the `.data` assignment replaced. Fine: no error, gradients at the noisy weights.
# expect: none
# outcome: ok
import torch
from torch import nn


class NoisyLinear(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)

    def forward(self, x):
        orig_weight = self.linear.weight.clone()
        noise = torch.randn_like(self.linear.weight)
        self.linear.weight.data = self.linear.weight.data + noise
        x = self.linear(x)
        self.linear.weight.data = orig_weight.data
        return x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = NoisyLinear(5, 4)
        self.fc2 = NoisyLinear(4, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def train(model, optimizer, steps=1):
    model.train()
    for _ in range(steps):
        inputs, labels = torch.randn(6, 5), torch.tensor([0, 1, 2, 0, 1, 2])
        output = model(inputs)
        loss = nn.CrossEntropyLoss()(output, labels)
        optimizer.zero_grad()
        loss.backward()


torch.manual_seed(0)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
train(model, optimizer)
