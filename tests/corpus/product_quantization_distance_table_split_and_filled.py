# SPQ's retrieval code builds a distance table with product quantization: it splits a zero table
# into per-codebook column views with `T.split` and fills them entry by entry with norms of the
# differentiable codewords, `D_C_split[j][k] = T.norm(...)`. split returns several views, which
# PyTorch forbids writing in place once the value needs gradients.
# expect: view-inplace
# outcome: raises RuntimeError
import numpy as np
import torch as T
from torch import nn


def pqDist_one(C, N_books, g_x, q_x):
    l1, l2 = C.shape
    L_word = int(l2 / N_books)
    D_C = T.zeros((l1, N_books), dtype=T.float32)
    q_x_split = T.split(q_x, L_word, 0)
    g_x_split = np.split(g_x.cpu().data.numpy(), N_books, 1)
    C_split = T.split(C, L_word, 1)
    D_C_split = T.split(D_C, 1, 1)  # @saved
    for j in range(N_books):
        for k in range(l1):
            D_C_split[j][k] = T.norm(q_x_split[j] - C_split[j][k], 2)  # @culprit
        if j == 0:
            dist = D_C_split[j][g_x_split[j]]
        else:
            dist = T.add(dist, D_C_split[j][g_x_split[j]])
    return T.squeeze(dist)


class SPQ(nn.Module):
    def __init__(self, n_codewords=3, dim=4):
        super().__init__()
        self.C = nn.Parameter(T.randn(n_codewords, dim))


T.manual_seed(0)
model = SPQ()
gallery_codes = T.tensor([[0, 2], [1, 1]])
query = T.randn(4)
distances = pqDist_one(model.C, 2, gallery_codes, query)
distances.sum().backward()
