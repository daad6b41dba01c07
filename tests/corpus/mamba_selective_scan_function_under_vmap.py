# state-spaces/mamba#239: calling a Mamba block inside torch.vmap fails: its selective scan is a
# custom autograd.Function whose forward takes ctx (the old style), and functorch transforms need
# the forward and setup_context split (plus a vmap rule). The maintainers do not plan to support it.
# expect: transform-unsupported
# outcome: raises RuntimeError
import torch
from torch import nn


class SelectiveScanFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, delta, A):  # @culprit
        deltaA = torch.exp(delta.unsqueeze(-1) * A)
        out = (deltaA.sum(-1) * u).cumsum(dim=-1)
        ctx.save_for_backward(u, delta, A)
        return out

    @staticmethod
    def backward(ctx, dout):
        u, delta, A = ctx.saved_tensors
        return dout, dout * u, None


def selective_scan_fn(u, delta, A):
    return SelectiveScanFn.apply(u, delta, A)  # @saved


class Mamba(nn.Module):
    def __init__(self, d_model=4, d_state=3):
        super().__init__()
        self.in_proj = nn.Linear(d_model, d_model)
        self.dt_proj = nn.Linear(d_model, d_model)
        self.A_log = nn.Parameter(torch.zeros(d_model, d_state))

    def forward(self, hidden_states):
        u = self.in_proj(hidden_states)
        delta = nn.functional.softplus(self.dt_proj(hidden_states))
        return selective_scan_fn(u, delta, -torch.exp(self.A_log))


torch.manual_seed(0)
block = Mamba()
x = torch.randn(3, 5, 4)
y = torch.vmap(block)(x)
