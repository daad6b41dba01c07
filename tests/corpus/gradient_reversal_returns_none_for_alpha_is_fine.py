# DANN's gradient reversal layer and training loop as its repository writes them: forward returns
# x.view_as(x) and keeps alpha on ctx, backward returns the negated, scaled gradient and None for
# alpha; the target batch's class output is discarded (`_, domain_output = my_net(...)`) and never
# backpropagated, so the step changing the weights it saved is harmless. Nothing to report.
# expect: none
# outcome: ok
import torch
from torch import nn
from torch.autograd import Function


class ReverseLayerF(Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        output = grad_output.neg() * ctx.alpha
        return output, None


class CNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.feature = nn.Sequential(nn.Linear(6, 8), nn.ReLU())
        self.class_classifier = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
        self.domain_classifier = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, input_data, alpha):
        feature = self.feature(input_data)
        reverse_feature = ReverseLayerF.apply(feature, alpha)
        return self.class_classifier(feature), self.domain_classifier(reverse_feature)


torch.manual_seed(0)
my_net = CNNModel()
optimizer = torch.optim.Adam(my_net.parameters(), lr=1e-3)
loss_class, loss_domain = nn.NLLLoss(), nn.NLLLoss()
for i in range(2):
    p = i / 2
    alpha = 2.0 / (1.0 + torch.exp(torch.tensor(-10 * p)).item()) - 1
    my_net.zero_grad()
    s_img, s_label, t_img = torch.randn(4, 6), torch.randint(0, 3, (4,)), torch.randn(4, 6)
    class_output, domain_output = my_net(s_img, alpha)
    err_s_label = loss_class(class_output.log_softmax(1), s_label)
    err_s_domain = loss_domain(domain_output.log_softmax(1), torch.zeros(4, dtype=torch.long))
    _, domain_output = my_net(t_img, alpha)
    err_t_domain = loss_domain(domain_output.log_softmax(1), torch.ones(4, dtype=torch.long))
    err = err_t_domain + err_s_domain + err_s_label
    err.backward()
    optimizer.step()
