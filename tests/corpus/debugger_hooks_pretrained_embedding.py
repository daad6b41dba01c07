# SageMaker Debugger's gradient hooks (awslabs/sagemaker-debugger#184): a text classifier built on
# pretrained word vectors with nn.Embedding.from_pretrained, whose weight does not require grad
# (freeze=True is its default). Registering a hook on every parameter fails at the embedding.
# expect: needs-grad tensor=model.embedding.weight
# outcome: raises RuntimeError
import torch
from torch import nn


class TestModel(nn.Module):
    def __init__(self, embedding_matrix, n_classes=2):
        super().__init__()
        self.embedding = nn.Embedding.from_pretrained(embedding_matrix)  # @culprit
        self.fc = nn.Linear(embedding_matrix.shape[1], n_classes)

    def forward(self, tokens):
        return self.fc(self.embedding(tokens).mean(dim=1))


def register_gradient_hooks(model, store):
    for name, param in model.named_parameters():
        param.register_hook(lambda grad, name=name: store.__setitem__(name, grad))  # @saved


torch.manual_seed(0)
embedding_matrix = torch.randn(10, 4)
model = TestModel(embedding_matrix)
grads = {}
register_gradient_hooks(model, grads)
loss = nn.functional.cross_entropy(model(torch.randint(0, 10, (3, 5))), torch.tensor([0, 1, 1]))
loss.backward()
