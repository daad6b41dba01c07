# Knowledge-neuron editing: after locating the FFN neurons that express a fact, the script edits the
# output projection's weight columns in place, `...output.dense.weight[:, pos] -= ori_pred_emb * lam`,
# reached through the model's nested modules. The weight is a leaf that requires grad, so the
# first edit outside no_grad raises.
# expect: leaf-inplace
# outcome: raises RuntimeError
import torch
from torch import nn


class Output(nn.Module):
    def __init__(self, d_ff, d_model):
        super().__init__()
        self.dense = nn.Linear(d_ff, d_model)


class Layer(nn.Module):
    def __init__(self, d_model=4, d_ff=6):
        super().__init__()
        self.intermediate = nn.Linear(d_model, d_ff)
        self.output = Output(d_ff, d_model)

    def forward(self, h):
        return h + self.output.dense(torch.relu(self.intermediate(h)))


class Encoder(nn.Module):
    def __init__(self, n_layers=2):
        super().__init__()
        self.layer = nn.ModuleList([Layer() for _ in range(n_layers)])


class Bert(nn.Module):
    def __init__(self, vocab=7, d_model=4):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, d_model)
        self.encoder = Encoder()


class MaskedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.bert = Bert()

    def forward(self, ids):
        h = self.bert.word_embeddings(ids)
        for layer in self.bert.encoder.layer:
            h = layer(h)
        return h @ self.bert.word_embeddings.weight.T


def edit_knowledge(model, neurons, ori_pred_label, tgt_label, lambda_list_1, lambda_list_2):
    ori_pred_emb = model.bert.word_embeddings.weight[ori_pred_label]
    tgt_emb = model.bert.word_embeddings.weight[tgt_label]
    for i, (layer, pos) in enumerate(neurons):
        model.bert.encoder.layer[layer].output.dense.weight[:, pos] -= ori_pred_emb * lambda_list_1[i]  # @culprit
        model.bert.encoder.layer[layer].output.dense.weight[:, pos] += tgt_emb * lambda_list_2[i]


torch.manual_seed(0)
model = MaskedLM()
ids = torch.tensor([1, 2, 3])
logits = model(ids)
scores = torch.softmax(logits[-1], -1)
ori_pred_label = int(scores.argmax())
edit_knowledge(model, [(0, 2), (1, 4)], ori_pred_label, 5, [1.0, 1.0], [8.0, 8.0])
