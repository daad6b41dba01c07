# MAML-Pytorch's meta-learner logs the query loss before and after the first inner update under
# torch.no_grad(); only the later steps build a graph. Run with update_step=1, the last entry of
# losses_q is one of the no_grad ones, and the meta-loss has no path to the weights.
# expect: graph-cut tensor=loss_q
# outcome: raises RuntimeError
import torch
from torch import nn
from torch.nn import functional as F


class Learner(nn.Module):
    def __init__(self, n_in=4, n_hidden=8, n_way=3):
        super().__init__()
        self.vars = nn.ParameterList([
            nn.Parameter(torch.randn(n_hidden, n_in) * 0.5), nn.Parameter(torch.zeros(n_hidden)),
            nn.Parameter(torch.randn(n_way, n_hidden) * 0.5), nn.Parameter(torch.zeros(n_way)),
        ])

    def forward(self, x, vars=None):
        w1, b1, w2, b2 = self.vars if vars is None else vars
        return F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)


class Meta(nn.Module):
    def __init__(self, update_lr=0.4, meta_lr=1e-3, update_step=1):
        super().__init__()
        self.update_lr = update_lr
        self.update_step = update_step
        self.net = Learner()
        self.meta_optim = torch.optim.Adam(self.net.parameters(), lr=meta_lr)

    def forward(self, x_spt, y_spt, x_qry, y_qry):
        task_num = x_spt.size(0)
        losses_q = [0 for _ in range(self.update_step + 1)]
        for i in range(task_num):
            logits = self.net(x_spt[i], vars=None)
            loss = F.cross_entropy(logits, y_spt[i])
            grad = torch.autograd.grad(loss, self.net.parameters())
            fast_weights = [p - self.update_lr * g for g, p in zip(grad, self.net.parameters())]
            with torch.no_grad():
                logits_q = self.net(x_qry[i], self.net.parameters())
                losses_q[0] += F.cross_entropy(logits_q, y_qry[i])
            with torch.no_grad():
                logits_q = self.net(x_qry[i], fast_weights)  # @culprit
                losses_q[1] += F.cross_entropy(logits_q, y_qry[i])
            for k in range(1, self.update_step):
                logits = self.net(x_spt[i], fast_weights)
                loss = F.cross_entropy(logits, y_spt[i])
                grad = torch.autograd.grad(loss, fast_weights)
                fast_weights = [p - self.update_lr * g for g, p in zip(grad, fast_weights)]
                logits_q = self.net(x_qry[i], fast_weights)
                losses_q[k + 1] += F.cross_entropy(logits_q, y_qry[i])
        loss_q = losses_q[-1] / task_num
        self.meta_optim.zero_grad()
        loss_q.backward()
        self.meta_optim.step()
        return loss_q.item()


torch.manual_seed(0)
maml = Meta(update_step=1)
x_spt, y_spt = torch.randn(2, 6, 4), torch.randint(0, 3, (2, 6))
x_qry, y_qry = torch.randn(2, 6, 4), torch.randint(0, 3, (2, 6))
maml(x_spt, y_spt, x_qry, y_qry)
