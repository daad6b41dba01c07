# salesforce/awd-lstm-lm#79 and #114: WeightDrop keeps the LSTM's hidden-to-hidden weight as
# `weight_hh_l0_raw` and, before each forward, sets the dropped copy under the original name with
# setattr. The original parameter is still registered under that name (PyTorch >= 1.0 keeps it in
# `_parameters`), so nn.Module refuses the plain tensor.
# expect: not-a-parameter tensor=w
# outcome: raises TypeError
import torch
from torch.nn import Parameter


class WeightDrop(torch.nn.Module):
    def __init__(self, module, weights, dropout=0.5):
        super(WeightDrop, self).__init__()
        self.module, self.weights, self.dropout = module, weights, dropout
        self._setup()

    def _setup(self):
        for name_w in self.weights:
            w = getattr(self.module, name_w)
            self.module.register_parameter(name_w + '_raw', Parameter(w.data))

    def _setweights(self):
        for name_w in self.weights:
            raw_w = getattr(self.module, name_w + '_raw')
            w = torch.nn.functional.dropout(raw_w, p=self.dropout, training=self.training)
            setattr(self.module, name_w, w)  # @culprit

    def forward(self, *args):
        self._setweights()
        return self.module.forward(*args)


torch.manual_seed(0)
rnn = WeightDrop(torch.nn.LSTM(3, 4), ['weight_hh_l0'], dropout=0.5)
output, hidden = rnn(torch.randn(2, 1, 3))
