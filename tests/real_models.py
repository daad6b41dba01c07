"""Real architectures from well-kept libraries, random init and tiny configs, for the tests:
each builder returns (model, make_batch, loss_of), where loss_of(model, batch) is one forward."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32))

    def batch():
        ids = torch.randint(0, 64, (2, 12))
        return ids, ids

    def loss_of(m, b):
        return m(input_ids=b[0], labels=b[1]).loss
    return model, batch, loss_of


def bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=64,
        max_position_embeddings=32, num_labels=3))

    def batch():
        return torch.randint(0, 64, (2, 10)), torch.tensor([0, 2])

    def loss_of(m, b):
        return m(input_ids=b[0], labels=b[1]).loss
    return model, batch, loss_of


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock, with in-place ReLUs as there."""

    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNetTiny(nn.Module):
    def __init__(self, use_checkpoint=False):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.layer1 = nn.Sequential(BasicBlock(8), BasicBlock(8))
        self.fc = nn.Linear(8, 10)
        self.use_checkpoint = use_checkpoint

    def forward(self, x):
        x = self.stem(x)
        x = checkpoint(self.layer1, x, use_reentrant=False) if self.use_checkpoint else self.layer1(x)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class DenseLayer(nn.Module):
    """torchvision's DenseNet _DenseLayer with memory_efficient=True: the bottleneck is checkpointed."""

    def __init__(self, in_ch, growth, reentrant):
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(in_ch), nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(in_ch, 4 * growth, 1, bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(4 * growth), nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)
        self.reentrant = reentrant

    def bottleneck(self, *inputs):
        return self.conv1(self.relu1(self.norm1(torch.cat(inputs, 1))))

    def forward(self, features):
        out = checkpoint(self.bottleneck, *features, use_reentrant=self.reentrant)
        return self.conv2(self.relu2(self.norm2(out)))


class DenseNetTiny(nn.Module):
    def __init__(self, reentrant=False):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.layers = nn.ModuleList([DenseLayer(8 + i * 4, 4, reentrant) for i in range(3)])
        self.head = nn.Linear(8 + 3 * 4, 10)

    def forward(self, x):
        features = [self.stem(x)]
        for layer in self.layers:
            features.append(layer(features))
        return self.head(torch.cat(features, 1).mean((2, 3)))


def resnet(use_checkpoint=False):
    torch.manual_seed(0)
    model = ResNetTiny(use_checkpoint)
    return model, _images, _classify


def densenet(reentrant=False):
    torch.manual_seed(0)
    model = DenseNetTiny(reentrant)
    return model, _images, _classify


def _images():
    return torch.randn(2, 3, 8, 8), torch.tensor([1, 7])


def _classify(m, b):
    return nn.functional.cross_entropy(m(b[0]), b[1])


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab=50, dim=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, dim, num_layers=2, batch_first=True, dropout=0.1)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids, state=None):
        h, state = self.lstm(self.emb(ids), state)
        return self.head(h), state


def lstm_lm():
    torch.manual_seed(0)
    model = LSTMLanguageModel()

    def batch():
        ids = torch.randint(0, 50, (2, 9))
        return ids[:, :-1], ids[:, 1:]

    def loss_of(m, b):
        logits, _ = m(b[0])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), b[1].reshape(-1))
    return model, batch, loss_of


def transformer_encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False), nn.Linear(16, 4))

    def batch():
        return torch.randn(2, 5, 16), torch.tensor([[0, 1, 2, 3, 0]] * 2)

    def loss_of(m, b):
        return nn.functional.cross_entropy(m(b[0]).reshape(-1, 4), b[1].reshape(-1))
    return model, batch, loss_of


MODELS = {
    "gpt2": gpt2, "bert": bert, "resnet": resnet, "resnet-checkpoint": lambda: resnet(True),
    "densenet-checkpoint": densenet, "densenet-checkpoint-reentrant": lambda: densenet(True),
    "lstm-lm": lstm_lm, "transformer-encoder": transformer_encoder,
}


def train_steps(model, batch, loss_of, optimizer, steps=2):
    """Two training steps and a validation pass without no_grad: what a notebook does."""
    model.train()
    for _ in range(steps):
        loss = loss_of(model, batch())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    val_loss = loss_of(model, batch())
    return loss.item(), val_loss.item()
