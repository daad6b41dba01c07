# pytorch/pytorch#54580: a module keeps the output of its last forward as an attribute
# (`self.exp = x`). copy.deepcopy(model) after a forward then meets that tensor, which has a
# grad_fn, and PyTorch deep-copies only leaves. Storing a plain local instead works, as the asker
# found.
# expect: nonleaf-copied tensor=self.exp
# outcome: raises RuntimeError
from copy import deepcopy

import torch
import torch.nn as nn


class test(nn.Module):
    def __init__(self):
        super(test, self).__init__()
        self.con1 = nn.Conv2d(1, 2, 3)
        self.con2 = nn.Conv2d(2, 1, 3)

    def forward(self, x):
        if True:
            return self.func(x)

    def func(self, x):
        self.exp = None
        x = self.con1(x)
        x = self.con2(x)
        self.exp = x  # @culprit
        return self.exp


model = test()
input = torch.Tensor(1, 1, 8, 8).uniform_()
output = model(input)
copyModel = deepcopy(model)  # @saved
