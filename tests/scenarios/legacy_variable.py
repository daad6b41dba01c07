# Old code: Variable still works and returns a plain tensor.
# expect: none
# outcome: ok
import torch
from torch.autograd import Variable

x = Variable(torch.ones(2, 2), requires_grad=True)
y = (x * 3).sum()
y.backward()
print(y.item(), x.cpu().detach().numpy().sum())
