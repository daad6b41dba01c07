# The flash-attention RotaryEmbedding after its fix: the cos/sin cache is also rebuilt when the
# module trains and the cached tables are inference tensors left by a validation pass under
# torch.inference_mode(), so training multiplies the queries by ordinary tensors.
# expect: none
# outcome: ok
import torch
from torch import nn


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_emb_torch(x, cos, sin):
    return x * cos + rotate_half(x) * sin


class RotaryEmbedding(nn.Module):
    def __init__(self, dim, base=10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._seq_len_cached = 0
        self._cos_cached = None
        self._sin_cached = None

    def _update_cos_sin_cache(self, seqlen, device=None, dtype=None):
        if (seqlen > self._seq_len_cached or self._cos_cached.device != device
                or self._cos_cached.dtype != dtype
                or (self.training and self._cos_cached.is_inference())):
            self._seq_len_cached = seqlen
            t = torch.arange(seqlen, device=device, dtype=torch.float32)
            freqs = torch.outer(t, self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            self._cos_cached, self._sin_cached = emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, q, k):
        seqlen = q.shape[1]
        self._update_cos_sin_cache(seqlen, device=q.device, dtype=q.dtype)
        cos, sin = self._cos_cached[:seqlen], self._sin_cached[:seqlen]
        return apply_rotary_emb_torch(q, cos, sin), apply_rotary_emb_torch(k, cos, sin)


class Attention(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.rotary_emb = RotaryEmbedding(dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k = self.rotary_emb(q, k)
        att = torch.softmax(q @ k.transpose(1, 2) / q.shape[-1] ** 0.5, dim=-1)
        return self.out(att @ v)


def validate(model, batch):
    model.eval()
    with torch.inference_mode():
        return model(batch).pow(2).mean().item()


def train_step(model, opt, batch):
    model.train()
    loss = model(batch).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


torch.manual_seed(0)
model = Attention()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
validate(model, torch.randn(2, 5, 8))
train_step(model, opt, torch.randn(2, 5, 8))
