# Wanting the gradient with respect to the input, the user sets inputs.requires_grad = True and
# then moves the batch, `inputs, targets = inputs.cuda(), targets.cuda()` (here a float64 batch
# made float32, the CPU equivalent): the moved copy is not a leaf, and inputs.grad stays None.
# expect: missing-grad tensor=inputs
# outcome: ok
import torch
from torch import nn

torch.manual_seed(0)
inputs = torch.randn(3, 5, dtype=torch.float64)
targets = torch.tensor([1, 2, 3])
inputs.requires_grad = True
inputs, targets = inputs.float(), targets.long()  # @culprit

Net = nn.Sequential(nn.Linear(5, 5), nn.Softmax(dim=-1))
Net.train()
optimizer = torch.optim.Adam(Net.parameters(), lr=0.001)
loss_fn = nn.NLLLoss()
input_grads = []
for i in range(2):
    optimizer.zero_grad()
    out = Net(inputs[0])
    loss = loss_fn(out.view(1, 5), targets[0].view(1))
    loss.backward()
    input_grads.append(inputs.grad)
    optimizer.step()
