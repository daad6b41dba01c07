# Project-MONAI/MONAI#1178: the CopyItemsd post-transform deep-copies an entry of the data dict;
# applied to the model's prediction (a tensor with a grad_fn, made in a training step), deepcopy
# refuses it. MONAI changed the transform to copy tensors with detach().clone().
# expect: nonleaf-copied
# outcome: raises RuntimeError
import copy

import torch
from torch import nn


class CopyItemsd:
    def __init__(self, keys, times, names):
        self.keys, self.times, self.names = keys, times, names

    def __call__(self, data):
        d = dict(data)
        for key, new_key in zip(self.keys * self.times, self.names):
            d[new_key] = copy.deepcopy(d[key])  # @saved
        return d


torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.Softmax(dim=1))
batch = {"image": torch.randn(1, 1, 4, 4), "label": torch.randint(0, 2, (1, 1, 4, 4))}
batch["pred"] = model(batch["image"])  # @culprit
post = CopyItemsd(keys=["pred"], times=1, names=["pred_copy"])
batch = post(batch)
