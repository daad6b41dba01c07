# Embedding Inspector (a stable-diffusion-webui extension) plots the vector of one token: it reads
# the row of the text encoder's token embedding and calls .numpy() on it for matplotlib. The
# embedding's weight is a parameter that requires grad, and so does the row taken from it.
# expect: grad-to-numpy tensor=emb_vec
# outcome: raises RuntimeError
import torch
from torch import nn


class TextEncoder(nn.Module):
    def __init__(self, vocab=10, dim=6):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, dim)


def do_inspect(encoder, token_id):
    embeddings = encoder.token_embedding.weight
    emb_vec = embeddings[token_id]  # @saved
    x = torch.arange(emb_vec.shape[0])
    return x.numpy(), emb_vec.numpy()  # @culprit


torch.manual_seed(0)
encoder = TextEncoder()
do_inspect(encoder, 3)
