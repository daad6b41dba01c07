# A BERT-style encoder with gradient checkpointing written the Hugging Face way (a closure from
# create_custom_forward passed to torch.utils.checkpoint.checkpoint, reentrant) trained under
# DistributedDataParallel with find_unused_parameters=True: the recomputation inside backward
# fires each layer's parameter hooks a second time, and DDP raises. (A process group of one, on
# gloo.)
# expect: ddp-ready-twice
# outcome: raises RuntimeError
import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch import nn


class Layer(nn.Module):
    def __init__(self, hidden=8):
        super().__init__()
        self.attention = nn.Linear(hidden, hidden)
        self.output = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU())
        self.norm = nn.LayerNorm(hidden)

    def forward(self, hidden_states, attention_mask):
        attn = self.attention(hidden_states) * attention_mask[..., None]
        return self.norm(hidden_states + self.output(attn))


class Encoder(nn.Module):
    def __init__(self, config, n_layers=2, hidden=8):
        super().__init__()
        self.config = config
        self.layer = nn.ModuleList([Layer(hidden) for _ in range(n_layers)])

    def forward(self, hidden_states, attention_mask):
        for layer_module in self.layer:
            if self.config.get("gradient_checkpointing", False):
                def create_custom_forward(module):
                    def custom_forward(*inputs):
                        return module(*inputs)
                    return custom_forward
                custom_forward = create_custom_forward(layer_module)
                hidden_states = torch.utils.checkpoint.checkpoint(custom_forward, hidden_states, attention_mask, use_reentrant=True)  # @culprit
            else:
                hidden_states = layer_module(hidden_states, attention_mask)
        return hidden_states


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embeddings = nn.Embedding(20, 8)
        self.encoder = Encoder(config)
        self.classifier = nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask):
        return self.classifier(self.encoder(self.embeddings(input_ids), attention_mask)[:, 0])


def training_step(model, optimizer, batch):
    input_ids, attention_mask, labels = batch
    loss = nn.functional.cross_entropy(model(input_ids, attention_mask), labels)
    optimizer.zero_grad()
    loss.backward()  # @saved
    optimizer.step()


dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Model({"gradient_checkpointing": True}), find_unused_parameters=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = (torch.randint(0, 20, (2, 5)), torch.ones(2, 5), torch.tensor([0, 1]))
    training_step(model, optimizer, batch)
finally:
    dist.destroy_process_group()
