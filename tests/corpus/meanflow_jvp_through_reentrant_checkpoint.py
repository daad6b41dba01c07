# haidog-yaqub/MeanFlow#4: MeanFlow's loss needs the JVP of the network, and with gradient
# checkpointing added to the model (torch.utils.checkpoint with use_reentrant=True) the JVP fails:
# reentrant checkpointing is incompatible with the .grad() that torch.autograd.functional.jvp runs.
# Non-reentrant checkpointing supports it.
# expect: checkpoint-incompatible
# outcome: raises RuntimeError
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class DiT(nn.Module):
    def __init__(self, dim=4, depth=2, grad_ckpt=True):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(dim + 2, dim), nn.SiLU()) for _ in range(depth)])
        self.grad_ckpt = grad_ckpt

    def forward(self, z, t, r):
        tr = torch.stack([t, r], dim=-1).expand(z.shape[0], 2)
        for block in self.blocks:
            if self.grad_ckpt:
                z = checkpoint(block, torch.cat([z, tr], dim=-1), use_reentrant=True)  # @culprit
            else:
                z = block(torch.cat([z, tr], dim=-1))
        return z


torch.manual_seed(0)
model = DiT()
x, e = torch.randn(3, 4), torch.randn(3, 4)
t, r = torch.tensor(0.7), torch.tensor(0.3)
z = (1 - t) * x + t * e
v = e - x
u, dudt = torch.autograd.functional.jvp(lambda z, t, r: model(z, t, r), (z, t, r),  # @saved
                                        (v, torch.ones(()), torch.zeros(())), create_graph=True)
loss = ((u - (v - (t - r) * dudt).detach()) ** 2).mean()
loss.backward()
