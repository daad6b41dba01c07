# A CAST-style contrastive loss keeps one queue of negatives per layer in a dict and enqueues the
# current keys (in place, under no_grad) just before the loss for that layer reads the queue. Each
# write comes before the read that saves the queue, never after it. Fine: trains without error.
# expect: none
# outcome: ok
import torch
import torch.nn.functional as F
from torch import nn


class NCELoss(nn.Module):
    def __init__(self, dim=4, K=6, T=0.07):
        super().__init__()
        self.K, self.T = K, T
        self.queue = {}
        self.ptr = {}

    @torch.no_grad()
    def dequeue_and_enqueue(self, keys, name):
        if name not in self.queue:
            self.queue[name] = F.normalize(torch.randn(keys.shape[1], self.K), dim=0)
            self.ptr[name] = 0
        ptr, batch_size = self.ptr[name], keys.shape[0]
        self.queue[name][:, ptr:ptr + batch_size] = F.normalize(keys, dim=1).T
        self.ptr[name] = (ptr + batch_size) % self.K

    def forward(self, q, k, name):
        q, k = F.normalize(q, dim=1), F.normalize(k, dim=1)
        l_pos = (q * k).sum(1, keepdim=True)
        l_neg = q @ self.queue[name]
        logits = torch.cat([l_pos, l_neg], 1) / self.T
        return F.cross_entropy(logits, torch.zeros(q.shape[0], dtype=torch.long))


class StyleProjector(nn.Module):
    def __init__(self, nce_layers=(0, 1)):
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(5, 4) for _ in nce_layers])

    def forward(self, feats, nce_layers):
        return [self.heads[i](feats[i]) for i in nce_layers]


def optimize_d(net_p, nce_loss, optimizer, nce_layers=(0, 1)):
    real_b = [torch.randn(2, 5) for _ in nce_layers]
    real_bx = [f + 0.1 * torch.randn_like(f) for f in real_b]
    query_b = net_p(real_b, nce_layers)
    query_bx = net_p(real_bx, nce_layers)
    loss_d_cont_b = 0
    for num, x in enumerate(nce_layers):
        nce_loss.dequeue_and_enqueue(query_b[num], "real_B{:d}".format(x))
        loss_d_cont_b += nce_loss(query_b[num], query_bx[num], "real_B{:d}".format(x))
    optimizer.zero_grad()
    loss_d_cont_b.backward()
    optimizer.step()


torch.manual_seed(0)
net_p = StyleProjector()
nce_loss = NCELoss()
optimizer = torch.optim.Adam(net_p.parameters(), lr=1e-3)
for _ in range(2):
    optimize_d(net_p, nce_loss, optimizer)
