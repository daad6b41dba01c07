# minimal-r1's GRPO step (the question in #2): `torch.exp(logp - logp.detach()) * advantages` is 1
# in value but has the policy-gradient derivative, and the KL to a frozen reference model is added;
# one optimizer over the policy. A 6-token vocabulary, 4 completions of 3 tokens for one prompt.
# expect: none
# outcome: ok
import copy

import torch
from torch import nn
from torch.nn import functional as F


class TinyLM(nn.Module):
    def __init__(self, vocab=6, hidden=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids):
        return self.head(torch.tanh(self.embed(ids)))


def per_token_logps(model, input_ids):
    logits = model(input_ids[:, :-1])
    return torch.gather(F.log_softmax(logits, dim=-1), 2, input_ids[:, 1:].unsqueeze(2)).squeeze(2)


def train_step(policy_model, ref_model, optimizer, completions, rewards, num_gen=4, beta=0.04):
    completion_mask = torch.ones(completions.shape[0], completions.shape[1] - 1)
    logp = per_token_logps(policy_model, completions)
    with torch.no_grad():
        ref_logp = per_token_logps(ref_model, completions)
    per_token_kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    mean_grouped_rewards = rewards.view(-1, num_gen).mean(dim=1).repeat_interleave(num_gen, dim=0)
    std_grouped_rewards = rewards.view(-1, num_gen).std(dim=1).repeat_interleave(num_gen, dim=0)
    advantages = (rewards - mean_grouped_rewards) / (std_grouped_rewards + 1e-4)
    per_token_loss = torch.exp(logp - logp.detach()) * advantages.unsqueeze(1)
    per_token_loss = -(per_token_loss - beta * per_token_kl)
    loss = ((per_token_loss * completion_mask).sum(dim=1) / completion_mask.sum(dim=1)).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


torch.manual_seed(0)
policy_model = TinyLM()
ref_model = copy.deepcopy(policy_model).requires_grad_(False)
optimizer = torch.optim.AdamW(policy_model.parameters(), lr=1e-2)
for _ in range(2):
    train_step(policy_model, ref_model, optimizer, torch.randint(0, 6, (4, 4)), torch.tensor([1.0, 0.0, 0.5, 0.0]))
