# learn2learn-style MAML: each task clones the meta-model (clone_module copies every parameter with
# `param.clone()`, so the clone's parameters are non-leaf tensors), then the loop freezes the
# clone's meta_block by setting requires_grad = False on those parameters, which PyTorch refuses.
# expect: nonleaf-requires-grad
# outcome: raises RuntimeError
import torch
from torch import nn


def clone_module(module, memo=None):
    if memo is None:
        memo = {}
    clone = module.__new__(type(module))
    clone.__dict__ = module.__dict__.copy()
    clone._parameters = clone._parameters.copy()
    clone._buffers = clone._buffers.copy()
    clone._modules = clone._modules.copy()
    for param_key in module._parameters:
        param = module._parameters[param_key]
        if param is not None:
            if param.data_ptr() in memo:
                clone._parameters[param_key] = memo[param.data_ptr()]
            else:
                cloned = param.clone()  # @saved
                clone._parameters[param_key] = cloned
                memo[param.data_ptr()] = cloned
    for module_key in clone._modules:
        clone._modules[module_key] = clone_module(module._modules[module_key], memo=memo)
    return clone


def update_module(module, updates):
    for (name, p), g in zip(list(module.named_parameters()), updates):
        owner = module
        *path, leaf = name.split(".")
        for part in path:
            owner = owner._modules[part]
        owner._parameters[leaf] = p - g
    return module


class MAML(nn.Module):
    def __init__(self, model, lr):
        super().__init__()
        self.module, self.lr = model, lr

    def forward(self, *args):
        return self.module(*args)

    def clone(self):
        return MAML(clone_module(self.module), lr=self.lr)

    def adapt(self, loss):
        params = [p for p in self.module.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
        update_module(self.module, [self.lr * g for g in grads])


class SRNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 8)
        self.meta_block = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.tail = nn.Linear(8, 4)

    def forward(self, x):
        return self.tail(self.meta_block(self.head(x)))


def meta_train(maml, tasks, opt, l1_loss):
    for low_res, gt in tasks:
        opt.zero_grad()
        task_model = maml.clone()
        output = task_model(low_res)
        adaptation_loss = l1_loss(gt, output)
        for name, p in task_model.module.meta_block.named_parameters():
            p.requires_grad = False  # @culprit
        task_model.adapt(adaptation_loss)
        evaluation_loss = l1_loss(gt, task_model(low_res))
        evaluation_loss.backward()
        opt.step()


torch.manual_seed(0)
model = SRNet()
maml = MAML(model, lr=0.01)
opt = torch.optim.Adam(maml.parameters(), lr=1e-3)
meta_train(maml, [(torch.randn(3, 4), torch.randn(3, 4))], opt, nn.L1Loss())
