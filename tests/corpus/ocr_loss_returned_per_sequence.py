# docTR's MASTER recognition model before its fix: compute_loss masks the per-character cross
# entropy past each word's end, averages it per word, and returns `ce_loss.unsqueeze(1)`, one
# loss per word. The training loop calls backward() on it and PyTorch refuses a non-scalar.
# expect: nonscalar-backward
# outcome: raises RuntimeError
import torch
from torch import nn
from torch.nn import functional as F


class MASTER(nn.Module):
    def __init__(self, vocab_size=5, max_length=4, n_feat=6):
        super().__init__()
        self.vocab_size, self.max_length = vocab_size, max_length
        self.encoder = nn.Sequential(nn.Linear(n_feat, 16), nn.ReLU())
        self.linear = nn.Linear(16, (max_length + 1) * (vocab_size + 1))

    @staticmethod
    def compute_loss(model_output, gt, seq_len):
        input_len = model_output.shape[1]
        seq_len = seq_len + 1  # the <eos> token
        cce = F.cross_entropy(model_output.permute(0, 2, 1), gt, reduction="none")
        mask_2d = torch.arange(input_len)[None, :] >= seq_len[:, None]
        cce[mask_2d] = 0
        ce_loss = cce.sum(1) / seq_len.to(dtype=model_output.dtype)
        return ce_loss.unsqueeze(1)  # @culprit

    def forward(self, x, gt, seq_len):
        logits = self.linear(self.encoder(x)).view(x.size(0), self.max_length + 1, self.vocab_size + 1)
        return {"out_map": logits, "loss": self.compute_loss(logits, gt, seq_len)}


def fit_one_epoch(model, train_loader, optimizer):
    model.train()
    for images, targets, seq_len in train_loader:
        train_loss = model(images, targets, seq_len)["loss"]
        optimizer.zero_grad()
        train_loss.backward()  # @saved
        optimizer.step()


torch.manual_seed(0)
model = MASTER()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
train_loader = [(torch.randn(3, 6), torch.randint(0, 6, (3, 5)), torch.tensor([2, 4, 3]))]
fit_one_epoch(model, train_loader, optimizer)
