# A SpeechBrain-style Brain computes features, normalises them and calls the encoder on
# `feats.detach()` (the recipe keeps feature extraction out of training). Asking for the
# gradient of the loss with respect to the input waveform, for a saliency map, raises: the
# waveform is not on the path any more.
# expect: missing-grad tensor=wavs
# outcome: raises RuntimeError
import torch
from torch import nn
from torch.nn import functional as F


class Brain:
    def __init__(self, modules):
        self.modules = nn.ModuleDict(modules)

    def prepare_features(self, wavs):
        feats = self.modules.compute_features(wavs)
        return self.modules.mean_var_norm(feats)

    def compute_forward(self, wavs):
        feats = self.prepare_features(wavs)
        x = self.modules.enc(feats.detach())  # @culprit
        return self.modules.output(x)

    def compute_objectives(self, predictions, labels):
        return F.nll_loss(F.log_softmax(predictions, dim=-1), labels)


torch.manual_seed(0)
brain = Brain({
    "compute_features": nn.Sequential(nn.Linear(16, 6), nn.ReLU()),
    "mean_var_norm": nn.LayerNorm(6),
    "enc": nn.Sequential(nn.Linear(6, 8), nn.ReLU()),
    "output": nn.Linear(8, 3),
})
wavs = torch.randn(2, 16, requires_grad=True)
labels = torch.tensor([0, 2])
loss = brain.compute_objectives(brain.compute_forward(wavs), labels)
saliency, = torch.autograd.grad(loss, wavs)
