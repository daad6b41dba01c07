"""Four notebooks a new user writes, each with one autograd bug, for the tests of the widget's
first screen: the same cells run in an InteractiveShell (tests/test_view_layout.py,
tests/test_widget.py) and in JupyterLab and Notebook 7 (tests/test_browser.py).

- gpt2: GPT-2 tiny (transformers, random init) under an adapter defined in an earlier cell;
  the adapter scales tanh's saved output in place.
- resnet: a ResNet (transformers, random init) with a head whose in-place ReLU runs again on
  what the ReLU before it saved.
- loop: 150 training steps of an MLP that add each loss to `total_loss` (graphs accumulate).
- rnn: an RNN whose hidden state is carried across batches without detach (the second
  backward runs into the graph the first one freed).

Each case is a list of cells; the last is the `%%autograd` cell. `CULPRIT[case]` is the cell
(counted from 1, as `In [N]` counts them when the notebook runs from the top) and line the
diagnosis must point at.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

LOAD = "%load_ext jupyter_autograd"

GPT2_MODULES = '''import torch
from torch import nn
import transformers
transformers.utils.logging.set_verbosity_error()


class Adapter(nn.Module):
    """A bottleneck adapter on GPT-2's hidden states."""

    def __init__(self, dim, scale=0.5):
        super().__init__()
        self.down = nn.Linear(dim, dim // 4)
        self.up = nn.Linear(dim // 4, dim)
        self.scale = scale

    def forward(self, x):
        h = torch.tanh(self.down(x))
        h *= self.scale
        return x + self.up(h)


class LMWithHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gpt = transformers.GPT2Model(config)
        self.adapter = Adapter(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, ids):
        return self.head(self.adapter(self.gpt(ids).last_hidden_state))'''

GPT2_STEP = '''%%autograd
torch.manual_seed(0)
config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=32)
model = LMWithHead(config)
ids = torch.randint(0, 100, (2, 16))
logits = model(ids)
loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 100), ids[:, 1:].reshape(-1))
loss.backward()'''

RESNET_STEP = '''%%autograd
import torch
from torch import nn
import transformers

class Classifier(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.backbone = transformers.ResNetModel(transformers.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32, 64], depths=[2, 2, 2], layer_type="basic"))
        self.proj = nn.Sequential(nn.Linear(64, 64), nn.ReLU(inplace=True))
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(64, classes)

    def forward(self, images):
        features = self.backbone(images).pooler_output.flatten(1)
        return self.fc(self.relu(self.proj(features)))

torch.manual_seed(0)
model = Classifier()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
images, labels = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
loss = nn.functional.cross_entropy(model(images), labels)
opt.zero_grad()
loss.backward()
opt.step()'''

LOOP_STEPS = '''%%autograd
import torch
from torch import nn
torch.manual_seed(0)
mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
x, y = torch.randn(64, 16), torch.randn(64, 1)
total_loss = 0
for step in range(150):
    loss = nn.functional.mse_loss(mlp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    total_loss += loss
print("mean loss", float(total_loss) / 150)'''

RNN_STATE = '''%%autograd
import torch
from torch import nn
torch.manual_seed(0)
rnn = nn.RNN(8, 16, batch_first=True)
head = nn.Linear(16, 1)
opt = torch.optim.SGD(list(rnn.parameters()) + list(head.parameters()), lr=0.01)
state = torch.zeros(1, 4, 16)
for step in range(3):
    x, y = torch.randn(4, 5, 8), torch.randn(4, 1)
    out, state = rnn(x, state)
    loss = nn.functional.mse_loss(head(out[:, -1]), y)
    opt.zero_grad()
    loss.backward()
    opt.step()'''

CASES: Dict[str, List[str]] = {
    "gpt2": [LOAD, GPT2_MODULES, GPT2_STEP],
    "resnet": [LOAD, RESNET_STEP],
    "loop": [LOAD, LOOP_STEPS],
    "rnn": [LOAD, RNN_STATE],
}

# (cell number, line): where the diagnosis's culprit is, as Jupyter numbers cells run in order.
CULPRIT: Dict[str, Tuple[int, int]] = {
    "gpt2": (2, 18),     # h *= self.scale, in the cell that defines the adapter
    "resnet": (2, 17),   # return self.fc(self.relu(self.proj(features)))
    "loop": (2, 14),     # total_loss += loss
    "rnn": (2, 11),      # out, state = rnn(x, state)
}
KINDS = {"gpt2": "saved-tensor-modified", "resnet": "saved-tensor-modified", "loop": "accumulated-graph",
         "rnn": "graph-freed"}


def run_in_shell(case: str):
    """Run a case's cells in a fresh InteractiveShell, as a notebook runs them; its Trace."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    InteractiveShell.clear_instance()
    shell = InteractiveShell.instance()
    try:
        cells = CASES[case]
        with capture_output():
            for cell in cells[:-1]:
                shell.run_cell(cell, store_history=True)
            magic, body = cells[-1].split("\n", 1)
            shell.run_cell(magic + " -q -o _case_trace\n" + body, store_history=True)
        return shell.user_ns["_case_trace"]
    finally:
        shell.run_line_magic("unload_ext", "jupyter_autograd")
        InteractiveShell.clear_instance()
