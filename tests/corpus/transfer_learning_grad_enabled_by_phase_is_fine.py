# The loop of PyTorch's transfer-learning tutorial: one model, a train and a val phase, the forward
# wrapped in torch.set_grad_enabled(phase == 'train'), backward and step only in the train phase,
# running statistics from loss.item() and an argmax over the outputs. Nothing to report.
# expect: none
# outcome: ok
import torch
from torch import nn


def train_model(model, dataloaders, criterion, optimizer, num_epochs=2):
    for epoch in range(num_epochs):
        for phase in ["train", "val"]:
            if phase == "train":
                model.train()
            else:
                model.eval()
            running_loss, running_corrects = 0.0, 0
            for inputs, labels in dataloaders[phase]:
                optimizer.zero_grad()
                with torch.set_grad_enabled(phase == "train"):
                    outputs = model(inputs)
                    _, preds = torch.max(outputs, 1)
                    loss = criterion(outputs, labels)
                    if phase == "train":
                        loss.backward()
                        optimizer.step()
                running_loss += loss.item() * inputs.size(0)
                running_corrects += torch.sum(preds == labels.data)
    return model


torch.manual_seed(0)
backbone = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU())
for param in backbone.parameters():
    param.requires_grad = False
model = nn.Sequential(backbone, nn.Dropout(0.2), nn.Linear(8, 2))
optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01, momentum=0.9)
dataloaders = {phase: [(torch.randn(4, 6), torch.randint(0, 2, (4,))) for _ in range(2)] for phase in ["train", "val"]}
model = train_model(model, dataloaders, nn.CrossEntropyLoss(), optimizer)
