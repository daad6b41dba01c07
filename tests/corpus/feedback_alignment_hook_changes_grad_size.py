# A feedback-alignment layer subclasses nn.Linear and registers a module backward hook that
# swaps the gradient at index 1 (the input's, when the layer has a bias) for one computed with
# a fixed random matrix. Built with bias=False, index 1 is the weight's gradient instead, the
# hook returns a tensor of another size, and backward raises.
# expect: backward-error
# outcome: raises RuntimeError
import torch
from torch import nn


def linear_fa_backward_hook(module, grad_input, grad_output):
    if grad_input[1] is not None:
        grad_input_fa = grad_output[0].mm(module.weight_fa)
        return (grad_input[0], grad_input_fa) + grad_input[2:]


class LinearFA(nn.Linear):
    def __init__(self, in_features, out_features, bias=True):
        super().__init__(in_features, out_features, bias=bias)
        self.register_buffer("weight_fa", torch.randn(out_features, in_features) / in_features ** 0.5)
        self.register_backward_hook(linear_fa_backward_hook)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = LinearFA(8, 3, bias=False)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        return self.fc2(x)  # @culprit


torch.manual_seed(0)
net = Net()
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
x, y = torch.randn(4, 6), torch.tensor([0, 2, 1, 0])
loss = nn.functional.cross_entropy(net(x), y)
optimizer.zero_grad()
loss.backward()  # @saved
optimizer.step()
