# CuriousAI/mean-teacher's pytorch/main.py `train`: the consistency loss pulls the student's
# logits to `Variable(ema_logit.detach().data, requires_grad=False)`, the logits of an EMA copy of
# the student that no optimizer holds and that `update_ema_variables` moves through `.data`. An MLP
# on 6 features, 3 classes, 2 labeled and 2 unlabeled examples a batch.
# expect: none
# outcome: ok
import torch
from torch import nn
from torch.autograd import Variable
from torch.nn import functional as F

NO_LABEL = -1


def create_model(ema=False):
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    if ema:
        for param in model.parameters():
            param.detach_()
    return model


def softmax_mse_loss(input_logits, target_logits):
    num_classes = input_logits.size()[1]
    return F.mse_loss(F.softmax(input_logits, dim=1), F.softmax(target_logits, dim=1), reduction='sum') / num_classes


def update_ema_variables(model, ema_model, alpha, global_step):
    alpha = min(1 - 1 / (global_step + 1), alpha)
    for ema_param, param in zip(ema_model.parameters(), model.parameters()):
        ema_param.data.mul_(alpha).add_(param.data, alpha=1 - alpha)


def train(train_loader, model, ema_model, optimizer, consistency_weight=1.0, ema_decay=0.99):
    class_criterion = nn.CrossEntropyLoss(reduction='sum', ignore_index=NO_LABEL)
    global_step = 0
    for i, ((input, ema_input), target) in enumerate(train_loader):
        minibatch_size = len(target)
        ema_model_out = ema_model(Variable(ema_input))
        model_out = model(Variable(input))
        logit1, ema_logit = model_out, ema_model_out
        ema_logit = Variable(ema_logit.detach().data, requires_grad=False)
        class_logit, cons_logit = logit1, logit1
        class_loss = class_criterion(class_logit, target) / minibatch_size
        consistency_loss = consistency_weight * softmax_mse_loss(cons_logit, ema_logit) / minibatch_size
        loss = class_loss + consistency_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        global_step += 1
        update_ema_variables(model, ema_model, ema_decay, global_step)


torch.manual_seed(0)
model, ema_model = create_model(), create_model(ema=True)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
loader = [((torch.randn(4, 6), torch.randn(4, 6)), torch.tensor([0, 2, NO_LABEL, NO_LABEL])) for _ in range(2)]
train(loader, model, ema_model, optimizer)
