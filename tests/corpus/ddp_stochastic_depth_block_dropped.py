# A stochastic-depth ResNet (each block survives a Bernoulli draw while training, and a dropped
# block switches its weights' requires_grad off) trained under DistributedDataParallel without
# find_unused_parameters: the first iteration drops a block, its weights get no gradient, and
# DDP raises at the next forward. (A process group of one, on gloo.)
# expect: ddp-unused-parameters tensor=net.blocks.1.fc1.weight
# outcome: raises RuntimeError
import torch
import torch.distributed as dist
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, planes, prob):
        super().__init__()
        self.fc1 = nn.Linear(planes, planes, bias=False)
        self.fc2 = nn.Linear(planes, planes, bias=False)
        self.prob = prob
        self.m = torch.distributions.bernoulli.Bernoulli(torch.Tensor([self.prob]))

    def forward(self, x):
        identity = x.clone()
        if self.training:
            if torch.equal(self.m.sample(), torch.ones(1)):
                self.fc1.weight.requires_grad = True
                self.fc2.weight.requires_grad = True
                out = self.fc2(torch.relu(self.fc1(x))) + identity
            else:
                self.fc1.weight.requires_grad = False
                self.fc2.weight.requires_grad = False
                out = identity
        else:
            out = self.fc2(torch.relu(self.fc1(x))) * self.prob + identity
        return torch.relu(out)


class StochasticResNet(nn.Module):
    def __init__(self, planes=6, depth=3, prob_last=0.5):
        super().__init__()
        self.stem = nn.Linear(4, planes)
        probs = [1 - (1 - prob_last) * (i + 1) / depth for i in range(depth)]
        self.blocks = nn.Sequential(*[BasicBlock(planes, p) for p in probs])
        self.fc = nn.Linear(planes, 2)

    def forward(self, x):
        return self.fc(self.blocks(torch.relu(self.stem(x))))


def train(model, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss()
    for x, y in batches:
        output = model(x)  # @culprit
        loss = criterion(output, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    torch.manual_seed(0)
    net = StochasticResNet()
    model = nn.parallel.DistributedDataParallel(net)
    train(model, [(torch.randn(4, 4), torch.randint(0, 2, (4,))) for _ in range(3)])
finally:
    dist.destroy_process_group()
