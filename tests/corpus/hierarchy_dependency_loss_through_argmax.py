# A hierarchical classifier's loss adds a "dependency" penalty built from argmax predictions and
# a new FloatTensor that checks them against the class hierarchy. The penalty has no path to the
# network: backward runs, and its weight beta changes nothing (the gradients are the same for
# every beta), as the repository's issue found.
# expect: graph-cut tensor=dloss
# outcome: ok
import torch
from torch import nn


class HierarchicalLossNetwork:
    def __init__(self, hierarchy, total_level=2, alpha=1, beta=0.8, p_loss=3):
        self.hierarchy = hierarchy
        self.total_level = total_level
        self.alpha, self.beta, self.p_loss = alpha, beta, p_loss

    def check_hierarchy(self, current_level, previous_level):
        bool_tensor = [not current_level[i].item() in self.hierarchy[previous_level[i].item()]
                       for i in range(previous_level.size(0))]
        return torch.FloatTensor(bool_tensor)

    def calculate_lloss(self, predictions, true_labels):
        lloss = 0
        for l in range(self.total_level):
            lloss += nn.CrossEntropyLoss()(predictions[l], true_labels[l])
        return self.alpha * lloss

    def calculate_dloss(self, predictions, true_labels):
        dloss = 0
        for l in range(1, self.total_level):
            current_lvl_pred = torch.argmax(nn.Softmax(dim=1)(predictions[l]), dim=1)  # @culprit
            prev_lvl_pred = torch.argmax(nn.Softmax(dim=1)(predictions[l - 1]), dim=1)
            D_l = self.check_hierarchy(current_lvl_pred, prev_lvl_pred)
            l_prev = torch.where(prev_lvl_pred == true_labels[l - 1], torch.FloatTensor([1]), torch.FloatTensor([0]))
            l_curr = torch.where(current_lvl_pred == true_labels[l], torch.FloatTensor([1]), torch.FloatTensor([0]))
            dloss += torch.sum(torch.pow(self.p_loss, D_l * l_prev) * torch.pow(self.p_loss, D_l * l_curr) - 1)
        return self.beta * dloss


class HierarchicalClassifier(nn.Module):
    def __init__(self, n_in=6, n_super=2, n_sub=4):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(n_in, 8), nn.ReLU())
        self.super_head = nn.Linear(8, n_super)
        self.sub_head = nn.Linear(8, n_sub)

    def forward(self, x):
        h = self.trunk(x)
        return [self.super_head(h), self.sub_head(h)]


def train(model, loss_network, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, super_y, sub_y in batches:
        predictions = model(x)
        dloss = loss_network.calculate_dloss(predictions, [super_y, sub_y])
        lloss = loss_network.calculate_lloss(predictions, [super_y, sub_y])
        total_loss = lloss + dloss
        optimizer.zero_grad()
        total_loss.backward()
        optimizer.step()


torch.manual_seed(0)
model = HierarchicalClassifier()
loss_network = HierarchicalLossNetwork(hierarchy={0: [0, 1], 1: [2, 3]})
sub = torch.randint(0, 4, (2, 8))
train(model, loss_network, [(torch.randn(8, 6), s // 2, s) for s in sub])
