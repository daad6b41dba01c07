# DeepNER's SpanModel builds its criterion with reduction='none' (kept for the pseudo-label
# weighting), but on the ordinary path it adds the per-token start and end losses and returns
# that vector as the loss; the training loop's loss.backward() then refuses a non-scalar.
# The culprit is the line that made the loss backward starts from: one `.mean()` there fixes both
# criterion calls (the criterion itself is built once, for the weighted path too).
# expect: nonscalar-backward
# outcome: raises RuntimeError
import torch
from torch import nn


class SpanModel(nn.Module):
    def __init__(self, vocab_size=20, hidden=8, num_tags=3, mid_linear_dims=6, dropout_prob=0.1):
        super().__init__()
        self.bert_module = nn.Embedding(vocab_size, hidden)
        self.num_tags = num_tags
        self.mid_linear = nn.Sequential(nn.Linear(hidden, mid_linear_dims), nn.ReLU(), nn.Dropout(dropout_prob))
        self.start_fc = nn.Linear(mid_linear_dims, num_tags)
        self.end_fc = nn.Linear(mid_linear_dims, num_tags)
        reduction = "none"
        self.criterion = nn.CrossEntropyLoss(reduction=reduction)

    def forward(self, token_ids, attention_masks, start_ids=None, end_ids=None):
        seq_out = self.mid_linear(self.bert_module(token_ids))
        start_logits = self.start_fc(seq_out)
        end_logits = self.end_fc(seq_out)
        out = (start_logits, end_logits)
        if start_ids is not None and end_ids is not None and self.training:
            start_logits = start_logits.view(-1, self.num_tags)
            end_logits = end_logits.view(-1, self.num_tags)
            active_loss = attention_masks.view(-1) == 1
            active_start_logits = start_logits[active_loss]
            active_end_logits = end_logits[active_loss]
            active_start_labels = start_ids.view(-1)[active_loss]
            active_end_labels = end_ids.view(-1)[active_loss]
            start_loss = self.criterion(active_start_logits, active_start_labels)
            end_loss = self.criterion(active_end_logits, active_end_labels)
            loss = start_loss + end_loss  # @culprit
            out = (loss,) + out
        return out


def train(model, train_loader):
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    model.train()
    for batch_data in train_loader:
        model.zero_grad()
        loss = model(**batch_data)[0]
        loss.backward()  # @saved
        optimizer.step()


torch.manual_seed(0)
model = SpanModel()
batch = {"token_ids": torch.randint(0, 20, (2, 5)),
         "attention_masks": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]),
         "start_ids": torch.randint(0, 3, (2, 5)), "end_ids": torch.randint(0, 3, (2, 5))}
train(model, [batch])
