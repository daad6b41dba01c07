# DeepNER's SpanModel on its pseudo-label path: the criterion keeps reduction='none' on purpose,
# the per-token losses are averaged per sentence and weighted by a learned rate between real and
# pseudo-labelled sentences, and only then summed into the scalar loss that backward() gets.
# expect: none
# outcome: ok
import torch
from torch import nn

SEQ_LEN = 5


class SpanModel(nn.Module):
    def __init__(self, vocab_size=20, hidden=8, num_tags=3, mid_linear_dims=6, dropout_prob=0.0):
        super().__init__()
        self.bert_module = nn.Embedding(vocab_size, hidden)
        self.num_tags = num_tags
        self.mid_linear = nn.Sequential(nn.Linear(hidden, mid_linear_dims), nn.ReLU(), nn.Dropout(dropout_prob))
        self.start_fc = nn.Linear(mid_linear_dims, num_tags)
        self.end_fc = nn.Linear(mid_linear_dims, num_tags)
        reduction = "none"
        self.criterion = nn.CrossEntropyLoss(reduction=reduction)
        self.loss_weight = nn.Parameter(torch.FloatTensor(1), requires_grad=True)
        self.loss_weight.data.fill_(-0.2)

    def forward(self, token_ids, attention_masks, start_ids=None, end_ids=None, pseudo=None):
        seq_out = self.mid_linear(self.bert_module(token_ids))
        start_logits = self.start_fc(seq_out)
        end_logits = self.end_fc(seq_out)
        out = (start_logits, end_logits)
        if start_ids is not None and end_ids is not None and self.training:
            start_logits = start_logits.view(-1, self.num_tags)
            end_logits = end_logits.view(-1, self.num_tags)
            start_loss = self.criterion(start_logits, start_ids.view(-1)).view(-1, SEQ_LEN).mean(dim=-1)
            end_loss = self.criterion(end_logits, end_ids.view(-1)).view(-1, SEQ_LEN).mean(dim=-1)
            pseudo_nums = pseudo.sum().item()
            total_nums = token_ids.shape[0]
            rate = torch.sigmoid(self.loss_weight)
            if pseudo_nums == 0:
                start_loss = start_loss.mean()
                end_loss = end_loss.mean()
            else:
                start_loss = (rate * pseudo * start_loss).sum() / pseudo_nums \
                    + ((1 - rate) * (1 - pseudo) * start_loss).sum() / (total_nums - pseudo_nums)
                end_loss = (rate * pseudo * end_loss).sum() / pseudo_nums \
                    + ((1 - rate) * (1 - pseudo) * end_loss).sum() / (total_nums - pseudo_nums)
            loss = start_loss + end_loss
            out = (loss,) + out
        return out


def train(model, train_loader):
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    model.train()
    for batch_data in train_loader:
        model.zero_grad()
        loss = model(**batch_data)[0]
        loss.backward()
        optimizer.step()


torch.manual_seed(0)
model = SpanModel()
batch = {"token_ids": torch.randint(0, 20, (3, SEQ_LEN)),
         "attention_masks": torch.ones(3, SEQ_LEN, dtype=torch.long),
         "start_ids": torch.randint(0, 3, (3, SEQ_LEN)), "end_ids": torch.randint(0, 3, (3, SEQ_LEN)),
         "pseudo": torch.tensor([1.0, 0.0, 0.0])}
train(model, [batch])
