# Atcold/NYU-DLSP20#765: the transformer notebook fills its positional embedding table with
# sines and cosines by writing slices of the embedding's weight (`E[:, 0::2] = ...`); the weight is
# a leaf that requires grad, and the write to a view of it is refused outside torch.no_grad().
# expect: leaf-inplace tensor=E
# outcome: raises RuntimeError
import numpy as np
import torch
import torch.nn as nn


def create_sinusoidal_embeddings(nb_p, dim, E):
    theta = np.array([[p / np.power(10000, 2 * (j // 2) / dim) for j in range(dim)] for p in range(nb_p)])
    E[:, 0::2] = torch.FloatTensor(np.sin(theta[:, 0::2]))  # @culprit
    E[:, 1::2] = torch.FloatTensor(np.cos(theta[:, 1::2]))
    E.detach_()
    E.requires_grad = False


class Embeddings(nn.Module):
    def __init__(self, d_model, vocab_size, max_position_embeddings):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, d_model, padding_idx=1)
        self.position_embeddings = nn.Embedding(max_position_embeddings, d_model)
        create_sinusoidal_embeddings(nb_p=max_position_embeddings, dim=d_model, E=self.position_embeddings.weight)


torch.manual_seed(0)
emb = Embeddings(d_model=8, vocab_size=20, max_position_embeddings=6)
