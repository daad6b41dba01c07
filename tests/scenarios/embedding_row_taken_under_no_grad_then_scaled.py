# Renormalising one embedding row: the row is picked under no_grad (to "only look"), and the
# division runs after the block, with grad on: "A view was created in no_grad mode and is being
# modified inplace with grad mode enabled".
# expect: view-inplace tensor=row
# outcome: raises RuntimeError
import torch
from torch import nn


class Vocab:
    def __init__(self, embedding):
        self.embedding = embedding

    def renormalise(self, index):
        with torch.no_grad():
            row = self.embedding.weight[index]  # @saved
            norm = row.norm()
        row.div_(norm)  # @culprit

    def loss(self, ids):
        return self.embedding(ids).pow(2).sum()


torch.manual_seed(0)
embedding = nn.Embedding(10, 4)
vocab = Vocab(embedding)
vocab.renormalise(3)
vocab.loss(torch.tensor([1, 3])).backward()
