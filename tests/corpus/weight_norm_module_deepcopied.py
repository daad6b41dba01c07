# pytorch/pytorch#28594 and #102981 (which broke deepcopy of HF Wav2Vec2), descript-audio-codec#81:
# torch.nn.utils.weight_norm computes the module's `weight` from `weight_g` and `weight_v` when it
# is applied, with grad on, so `weight` is a tensor with a grad_fn, and copy.deepcopy refuses it.
# The parametrization version, torch.nn.utils.parametrizations.weight_norm, copies.
# expect: nonleaf-copied
# outcome: raises RuntimeError
import warnings
from copy import deepcopy

import torch
import torch.nn as nn

warnings.filterwarnings("ignore", "`torch.nn.utils.weight_norm` is deprecated")
net = nn.Sequential(nn.utils.weight_norm(nn.Linear(2, 3)), nn.Linear(3, 10))  # @culprit
net2 = deepcopy(net)  # @saved
