# GroMo's TensorStatistic after PR 138: `update` is decorated with @torch.no_grad(), so the
# statistic S = sum of x^T x computed from the stored input records no graph, and each batch's graph
# goes with its backward. Fine: the running statistic has no history.
# expect: none
# outcome: ok
import torch
import torch.nn.functional as F
from torch import nn


class TensorStatistic:
    def __init__(self, shape, update_function, name=None):
        self._shape = shape
        self._update_function = update_function
        self.name = name if name is not None else "TensorStatistic"
        self._tensor = None
        self.samples = 0
        self.updated = True

    @torch.no_grad()
    def update(self, **kwargs):
        if self.updated is False:
            update, nb_sample = self._update_function(**kwargs)
            assert self._shape is None or self._shape == update.size()
            if self._tensor is None:
                self._tensor = update
            else:
                self._tensor += update
            self.samples += nb_sample
            self.updated = True

    def __call__(self):
        return self._tensor / self.samples


class LinearGrowingModule(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.layer = nn.Linear(in_features, out_features)
        self.store_input = False
        self._input = None
        self.tensor_s = TensorStatistic((in_features, in_features), update_function=self.compute_s, name="S")

    @property
    def input(self):
        return self._input

    def compute_s(self):
        return torch.einsum("ij,ik->jk", self.input, self.input), self.input.shape[0]

    def forward(self, x):
        if self.store_input:
            self._input = x
        return self.layer(x)


class GrowingNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = LinearGrowingModule(5, 4)
        self.second = LinearGrowingModule(4, 3)

    def forward(self, x):
        return self.second(F.relu(self.first(x)))


def compute_statistics(net, train_dataloader):
    net.second.store_input = True
    for x, y in train_dataloader:
        net.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        net.second.tensor_s.updated = False
        net.second.tensor_s.update()
    net.second.store_input = False


torch.manual_seed(0)
net = GrowingNet()
train_dataloader = [(torch.rand(8, 5), torch.randint(0, 3, (8,))) for _ in range(3)]
compute_statistics(net, train_dataloader)
S = net.second.tensor_s()
