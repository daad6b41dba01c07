# labelmodels' LabelModel._do_estimate_label_model before its fix: each batch's loss (the negative
# mean log-likelihood plus the accuracy prior) is added to `running_loss` as a tensor, so the epoch's
# running total links every batch's graph into one that grows until the epoch ends.
# expect: accumulated-graph tensor=running_loss
# outcome: ok
import logging

import torch
from torch import nn


class LearningConfig:
    def __init__(self):
        self.epochs = 2
        self.step_size = 0.01
        self.momentum = 0.9


class LabelModel(nn.Module):
    def _do_estimate_label_model(self, batches, config):
        optimizer = torch.optim.SGD(self.parameters(), lr=config.step_size, momentum=config.momentum,
                                    weight_decay=0)
        for epoch in range(config.epochs):
            self.train()
            running_loss = 0.0
            for i_batch, inputs in enumerate(batches):
                optimizer.zero_grad()
                log_likelihood = self(*inputs)
                loss = -1 * torch.mean(log_likelihood)
                loss += self._get_regularization_loss()
                loss.backward()
                optimizer.step()
                running_loss += loss  # @culprit
            epoch_loss = running_loss / len(batches)
            logging.info("Train Loss: %.6f", epoch_loss)

    def _get_regularization_loss(self):
        return 0.0


class NaiveBayes(LabelModel):
    def __init__(self, num_classes, num_lfs, init_acc=0.7, acc_prior=0.025):
        super().__init__()
        self.init_acc = -1 * torch.log(torch.tensor(1.0 / init_acc - 1)).item() / 2
        self.accuracy = nn.Parameter(torch.full((num_lfs, num_classes), self.init_acc))
        self.propensity = nn.Parameter(torch.zeros(num_lfs))
        self.class_balance = nn.Parameter(torch.zeros(num_classes))
        self.num_classes, self.acc_prior = num_classes, acc_prior

    def forward(self, votes):
        # votes: (m, n) in {0 (abstain), 1..k}; one-hot over classes, abstains all zero
        onehot = nn.functional.one_hot(votes, self.num_classes + 1)[..., 1:].float()
        agree = torch.einsum("mnk,nk->mk", onehot, self.accuracy)
        disagree = torch.einsum("mnk,nk->mk", onehot.sum(-1, keepdim=True) - onehot, self.accuracy)
        cll = agree - disagree + (votes > 0).float() @ self.propensity.unsqueeze(1)
        return torch.logsumexp(cll + torch.log_softmax(self.class_balance, 0), dim=1)

    def _get_regularization_loss(self):
        return self.acc_prior * torch.norm(self.accuracy - self.init_acc)

    def estimate_label_model(self, votes, config=None):
        batches = [(votes[i:i + 4],) for i in range(0, len(votes), 4)]
        self._do_estimate_label_model(batches, config or LearningConfig())


torch.manual_seed(0)
model = NaiveBayes(num_classes=2, num_lfs=3)
model.estimate_label_model(torch.randint(0, 3, (12, 3)))
