# pytorch/pytorch#44022: a BERT-based QA model mixes its layers with learned weights, and its
# forward normalises them by assigning the softmax back to the parameter's own name:
# `self.layer_weights = F.softmax(self.layer_weights, dim=0)`. nn.Module refuses to replace a
# parameter with a plain tensor; the softmax belongs in a local.
# expect: not-a-parameter tensor=self.layer_weights
# outcome: raises TypeError
import torch
from torch import nn
from torch.nn import functional as F


class LayerMixQA(nn.Module):
    def __init__(self, num_layers=3, hidden=4):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(hidden, hidden) for _ in range(num_layers)])
        self.layer_weights = nn.Parameter(torch.ones(num_layers))  # @saved
        self.qa_outputs = nn.Linear(hidden, 2)

    def forward(self, x):
        hidden_states = []
        for layer in self.layers:
            x = torch.tanh(layer(x))
            hidden_states.append(x)
        self.layer_weights = F.softmax(self.layer_weights, dim=0)  # @culprit
        mixed = sum(w * h for w, h in zip(self.layer_weights, hidden_states))
        return self.qa_outputs(mixed)


torch.manual_seed(0)
model = LayerMixQA()
outputs = model(torch.randn(2, 5, 4))
outputs.sum().backward()
