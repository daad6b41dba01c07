# A MoCo-style model keeps its negative keys in a `queue` buffer. The negative logits read the buffer
# itself (MoCo's builder reads `self.queue.clone().detach()`), and `_dequeue_and_enqueue` then
# overwrites a slice of it under no_grad inside the same forward: the einsum saved the queue for q's
# gradient, so the training step's backward fails.
# expect: saved-tensor-modified tensor=self.queue
# outcome: raises RuntimeError
import torch
import torch.nn.functional as F
from torch import nn


class MoCo(nn.Module):
    def __init__(self, dim=4, K=8, m=0.99, T=0.07):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = nn.Linear(6, dim)
        self.encoder_k = nn.Linear(6, dim)
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data.copy_(param_q.data)
            param_k.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data = param_k.data * self.m + param_q.data * (1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        batch_size = keys.shape[0]
        ptr = int(self.queue_ptr)
        self.queue[:, ptr:ptr + batch_size] = keys.T  # @culprit
        self.queue_ptr[0] = (ptr + batch_size) % self.K

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            self._momentum_update_key_encoder()
            k = F.normalize(self.encoder_k(im_k), dim=1)
        l_pos = torch.einsum("nc,nc->n", [q, k]).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", [q, self.queue])  # @saved
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        self._dequeue_and_enqueue(k)
        return logits, labels


def train(model, optimizer, steps=2):
    criterion = nn.CrossEntropyLoss()
    for _ in range(steps):
        im_q, im_k = torch.randn(2, 6), torch.randn(2, 6)
        output, target = model(im_q, im_k)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


torch.manual_seed(0)
model = MoCo()
optimizer = torch.optim.SGD(model.encoder_q.parameters(), lr=0.1)
train(model, optimizer)
