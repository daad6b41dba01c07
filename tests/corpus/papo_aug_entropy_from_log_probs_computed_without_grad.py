# PAPO's actor update (verl/workers/actor/dp_actor.py, `update_policy`, with RECOMPUTE_AUG_LOG_PROBS
# off): the augmented-input log-probs were computed before the update by `compute_log_prob`, which
# runs under torch.no_grad(), and the update reuses them for `aug_entropy_loss`. The maintainer:
# "in current implementation the aug_entropy_loss does not directly affect the gradients". The cut
# is the decorator that switches grad off for the call that made them. A policy over a 5-token
# vocabulary on 4 image features; masking the image gives the augmented input.
# expect: graph-cut
# outcome: ok
import torch
from torch import nn
from torch.nn import functional as F


def masked_mean(values, mask):
    return (values * mask).sum() / mask.sum()


class Policy(nn.Module):
    def __init__(self, vocab=5, features=4, hidden=8):
        super().__init__()
        self.vision = nn.Linear(features, hidden)
        self.embed = nn.Embedding(vocab, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, image, responses):
        h = torch.tanh(self.vision(image).unsqueeze(1) + self.embed(responses))
        return self.head(h)


class DataParallelPPOActor:
    def __init__(self, actor_module, clip_ratio=0.2, kl_prcp_coef=0.02, aug_entropy_loss_coef=0.03):
        self.actor_module = actor_module
        self.actor_optimizer = torch.optim.AdamW(actor_module.parameters(), lr=1e-3)
        self.clip_ratio, self.kl_prcp_coef, self.aug_entropy_loss_coef = clip_ratio, kl_prcp_coef, aug_entropy_loss_coef

    def _forward_micro_batch(self, image, responses):
        logits = self.actor_module(image, responses)
        return torch.gather(F.log_softmax(logits, dim=-1), -1, responses.unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()  # @culprit
    def compute_log_prob(self, image, responses):
        return self._forward_micro_batch(image, responses)

    def update_policy(self, model_inputs):
        responses, response_mask = model_inputs["responses"], model_inputs["response_mask"]
        old_log_probs, advantages = model_inputs["old_log_probs"], model_inputs["advantages"]
        log_probs = self._forward_micro_batch(model_inputs["image"], responses)
        aug_log_probs = model_inputs.get("aug_log_probs", None)
        ratio = torch.exp(log_probs - old_log_probs)
        pg_losses = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - self.clip_ratio, 1 + self.clip_ratio))
        pg_loss = masked_mean(pg_losses, response_mask)
        if aug_log_probs is not None:
            aug_entropy_loss = -masked_mean(aug_log_probs, response_mask)
            aug_kld = log_probs - aug_log_probs
            kl_prcp_loss = masked_mean(aug_kld, response_mask)
            pg_loss = pg_loss - kl_prcp_loss * self.kl_prcp_coef
            pg_loss = pg_loss + self.aug_entropy_loss_coef * aug_entropy_loss
        self.actor_optimizer.zero_grad()
        pg_loss.backward()
        self.actor_optimizer.step()


torch.manual_seed(0)
actor = DataParallelPPOActor(Policy())
for _ in range(2):
    image, responses = torch.randn(2, 4), torch.randint(0, 5, (2, 3))
    batch = {"image": image, "responses": responses, "response_mask": torch.ones(2, 3),
             "advantages": torch.randn(2, 1)}
    batch["old_log_probs"] = actor.compute_log_prob(image, responses)
    batch["aug_log_probs"] = actor.compute_log_prob(torch.zeros_like(image), responses)
    actor.update_policy(batch)
