# MAML with second-order gradients (learn2learn's adapt with first_order=False, spelled out with
# autograd.grad(create_graph=True) and torch.func.functional_call) on a small transformer whose
# attention calls F.scaled_dot_product_attention. The meta-loss backward needs the derivative
# of SDPA's backward, which is not implemented.
# expect: not-differentiable
# outcome: raises RuntimeError
import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F


class SelfAttention(nn.Module):
    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)  # @culprit
        return self.proj(out.transpose(1, 2).reshape(B, T, C))


class Regressor(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.embed = nn.Linear(1, dim)
        self.attn = SelfAttention(dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        h = self.embed(x)
        return self.head(h + self.attn(h))


def adapt(model, params, loss, lr, first_order=False):
    grads = torch.autograd.grad(loss, list(params.values()), create_graph=not first_order)
    return {name: p - lr * g for (name, p), g in zip(params.items(), grads)}


def meta_train_step(model, optimizer, tasks, adapt_lr=0.01):
    optimizer.zero_grad()
    meta_loss = 0.0
    for support_x, support_y, query_x, query_y in tasks:
        params = dict(model.named_parameters())
        support_loss = F.mse_loss(functional_call(model, params, (support_x,)), support_y)
        fast = adapt(model, params, support_loss, adapt_lr)
        meta_loss = meta_loss + F.mse_loss(functional_call(model, fast, (query_x,)), query_y)
    meta_loss.backward()  # @saved
    optimizer.step()


torch.manual_seed(0)
model = Regressor()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
tasks = [tuple(torch.randn(2, 5, 1) for _ in range(4)) for _ in range(2)]
meta_train_step(model, optimizer, tasks)
