# Quantization-aware training after calibration: `compute_encodings` runs the calibration batches
# under `torch.inference_mode()` and stores each quantizer's scale as an attribute. QAT then trains
# the model with the fake-quantizers in place; dividing by the stored scale saves it for the input's
# gradient, and an inference tensor cannot be saved, so the first training forward raises.
# expect: inference-tensor-saved tensor=self.scale
# outcome: raises RuntimeError
import torch
from torch import nn


class FakeQuantize(nn.Module):
    def __init__(self, bits=8):
        super().__init__()
        self.levels = 2 ** (bits - 1) - 1
        self.scale = None

    def observe(self, x):
        self.scale = x.abs().max() / self.levels  # @culprit

    def forward(self, x):
        q = torch.round(x / self.scale).clamp(-self.levels, self.levels)  # @saved
        return (q * self.scale - x).detach() + x


class QuantSim:
    def __init__(self, model):
        self.model = model
        self.quantizers = {name: FakeQuantize() for name, _ in model.named_children()}
        for name, module in model.named_children():
            module.register_forward_pre_hook(self._make_hook(name))
        self.calibrating = False

    def _make_hook(self, name):
        def hook(module, args):
            if self.calibrating:
                self.quantizers[name].observe(args[0])
                return None
            return (self.quantizers[name](args[0]),)
        return hook

    def compute_encodings(self, batches):
        self.calibrating = True
        with torch.inference_mode():
            for x in batches:
                self.model(x)
        self.calibrating = False


def train_qat(sim, optimizer, steps=2):
    for _ in range(steps):
        x, y = torch.randn(4, 3), torch.randn(4, 1)
        loss = nn.functional.mse_loss(sim.model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 1))
sim = QuantSim(model)
sim.compute_encodings([torch.randn(4, 3) for _ in range(2)])
train_qat(sim, torch.optim.SGD(model.parameters(), lr=0.01))
