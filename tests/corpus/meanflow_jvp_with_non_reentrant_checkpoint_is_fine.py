# The MeanFlow JVP with the fix the PyTorch message suggests: checkpointing with use_reentrant=False
# composes with the .grad() that torch.autograd.functional.jvp runs. Nothing to report.
# expect: none
# outcome: ok
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class DiT(nn.Module):
    def __init__(self, dim=4, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(dim, dim), nn.SiLU()) for _ in range(depth)])

    def forward(self, z):
        for block in self.blocks:
            z = checkpoint(block, z, use_reentrant=False)
        return z


torch.manual_seed(0)
model = DiT()
z, v = torch.randn(3, 4), torch.randn(3, 4)
u, dudt = torch.autograd.functional.jvp(model, (z,), (v,), create_graph=True)
loss = ((u - (v - dudt).detach()) ** 2).mean()
loss.backward()
