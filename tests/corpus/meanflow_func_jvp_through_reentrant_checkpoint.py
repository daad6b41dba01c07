# MeanFlow (haidog-yaqub/MeanFlow#4) computes the JVP with torch.func.jvp; there reentrant
# checkpointing fails differently: its CheckpointFunction is an autograd.Function without
# setup_context, which torch.func transforms refuse. The checkpoint call with use_reentrant=True
# is the cause, not a Function of the user's.
# expect: transform-unsupported
# outcome: raises RuntimeError
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class DiT(nn.Module):
    def __init__(self, dim=4, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(dim, dim), nn.SiLU()) for _ in range(depth)])

    def forward(self, z):
        for block in self.blocks:
            z = checkpoint(block, z, use_reentrant=True)  # @culprit
        return z


torch.manual_seed(0)
model = DiT()
z, v = torch.randn(3, 4), torch.randn(3, 4)
u, dudt = torch.func.jvp(model, (z,), (v,))
