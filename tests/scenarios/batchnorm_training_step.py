# BatchNorm writes its running statistics in place during forward; nothing saved is touched.
# expect: none
# outcome: ok
import torch
from torch import nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(inplace=True), nn.Linear(8, 1))
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
for step in range(3):
    loss = net(torch.randn(16, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
