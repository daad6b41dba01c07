# descript-audio-codec#81's fix: torch.nn.utils.parametrizations.weight_norm keeps `weight` as a
# parametrization computed on access, so the module's tensors are all leaves and copy.deepcopy
# works (an EMA copy of the model, as ema-pytorch makes). Nothing to report.
# expect: none
# outcome: ok
from copy import deepcopy

import torch
import torch.nn as nn

net = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(2, 3)), nn.Linear(3, 10))
out = net(torch.randn(4, 2))
ema = deepcopy(net)
out.sum().backward()
