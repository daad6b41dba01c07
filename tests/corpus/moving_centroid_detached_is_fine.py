# The MSTN semantic loss as its repository writes it: the moving class centroids are stored with
# .detach(), so each batch's loss still flows into its own features while the stored centroids
# carry only values from one batch to the next. Nothing to report.
# expect: none
# outcome: ok
import torch
from torch import nn
from torch.nn import functional as F


class MSTN(nn.Module):
    def __init__(self, n_features=5, n_hidden=6, n_class=3, decay=0.3):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(n_features, n_hidden), nn.ReLU())
        self.classifier = nn.Linear(n_hidden, n_class)
        self.n_class = n_class
        self.decay = decay
        self.register_buffer("s_centroid", torch.zeros(n_class, n_hidden))
        self.register_buffer("t_centroid", torch.zeros(n_class, n_hidden))

    def forward(self, x):
        feature = self.features(x)
        return feature, self.classifier(feature)

    def class_means(self, feature, labels):
        ones = torch.ones(labels.size(0))
        count = torch.zeros(self.n_class).scatter_add(0, labels, ones).clamp(min=1)
        total = torch.zeros(self.n_class, feature.size(1)).index_add(0, labels, feature)
        return total / count[:, None]

    def adloss(self, s_feature, t_feature, y_s, y_t):
        current_s_centroid = self.class_means(s_feature, y_s)
        current_t_centroid = self.class_means(t_feature, y_t)
        decay = self.decay
        s_centroid = (1 - decay) * self.s_centroid + decay * current_s_centroid
        t_centroid = (1 - decay) * self.t_centroid + decay * current_t_centroid
        semantic_loss = F.mse_loss(s_centroid, t_centroid)
        self.s_centroid = s_centroid.detach()
        self.t_centroid = t_centroid.detach()
        return semantic_loss


def train(model, batches, lam=0.5):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for s_x, s_y, t_x in batches:
        s_feature, s_logits = model(s_x)
        t_feature, t_logits = model(t_x)
        t_pseudo = t_logits.argmax(1)
        loss = F.cross_entropy(s_logits, s_y) + lam * model.adloss(s_feature, t_feature, s_y, t_pseudo)
        opt.zero_grad()
        loss.backward()
        opt.step()


torch.manual_seed(0)
model = MSTN()
train(model, [(torch.randn(6, 5), torch.randint(0, 3, (6,)), torch.randn(6, 5)) for _ in range(3)])
