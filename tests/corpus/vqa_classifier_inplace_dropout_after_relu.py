# A bottom-up-attention VQA model: its SimpleClassifier is an nn.Sequential of weight-normed Linear,
# ReLU, Dropout(inplace=True), Linear. In training mode the in-place dropout rewrites the ReLU's
# output, which ReLU saved for backward, so the first training step's backward fails.
# expect: saved-tensor-modified
# outcome: raises RuntimeError
import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm


class SimpleClassifier(nn.Module):
    def __init__(self, in_dim, hid_dim, out_dim, dropout):
        super().__init__()
        layers = [
            weight_norm(nn.Linear(in_dim, hid_dim), dim=None),
            nn.ReLU(),
            nn.Dropout(dropout, inplace=True),
            weight_norm(nn.Linear(hid_dim, out_dim), dim=None),
        ]
        self.main = nn.Sequential(*layers)

    def forward(self, x):
        logits = self.main(x)  # @culprit @saved
        return logits


class BaseModel(nn.Module):
    def __init__(self, q_dim=5, v_dim=5, num_hid=6, num_answers=3):
        super().__init__()
        self.q_net = nn.Linear(q_dim, num_hid)
        self.v_net = nn.Linear(v_dim, num_hid)
        self.classifier = SimpleClassifier(num_hid, num_hid * 2, num_answers, 0.5)

    def forward(self, v, q):
        joint_repr = self.q_net(q) * self.v_net(v.mean(1))
        return self.classifier(joint_repr)


def instance_bce_with_logits(logits, labels):
    return nn.functional.binary_cross_entropy_with_logits(logits, labels) * labels.size(1)


def train(model, optim, num_batches=2):
    for _ in range(num_batches):
        v, q, a = torch.randn(4, 3, 5), torch.randn(4, 5), torch.rand(4, 3)
        pred = model(v, q)
        loss = instance_bce_with_logits(pred, a)
        loss.backward()
        optim.step()
        optim.zero_grad()


torch.manual_seed(0)
model = BaseModel()
optim = torch.optim.Adamax(model.parameters())
train(model, optim)
