# davidmrau/mixture-of-experts' MoE builds its gating weights as
# `nn.Parameter(torch.zeros(...), requires_grad=True).to(self.device)`: the move returns a plain
# tensor made from the Parameter, so the gate is never registered, the optimizer never sees it,
# and its .grad stays None while the experts train. (The move to CUDA is written here as the
# float64 to float32 move it also is for a float64 tensor, so that it copies on a CPU.)
# expect: missing-grad
# outcome: ok
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, input_size, output_size, hidden_size):
        super().__init__()
        self.fc1 = nn.Linear(input_size, hidden_size)
        self.fc2 = nn.Linear(hidden_size, output_size)

    def forward(self, x):
        return torch.softmax(self.fc2(torch.relu(self.fc1(x))), dim=1)


class MoE(nn.Module):
    def __init__(self, input_size, output_size, num_experts, hidden_size, k=2,
                 device=torch.device("cpu"), dtype=torch.float32):
        super().__init__()
        self.device, self.k = device, k
        self.experts = nn.ModuleList([MLP(input_size, output_size, hidden_size) for _ in range(num_experts)])
        self.w_gate = nn.Parameter(torch.zeros(input_size, num_experts, dtype=torch.float64), requires_grad=True).to(self.device, dtype)  # @culprit

    def top_k_gating(self, x):
        logits = x @ self.w_gate
        top_logits, top_indices = logits.topk(self.k, dim=1)
        top_k_gates = torch.softmax(top_logits, dim=1)
        return torch.zeros_like(logits).scatter(1, top_indices, top_k_gates)

    def forward(self, x):
        gates = self.top_k_gating(x)
        expert_outputs = torch.stack([e(x) for e in self.experts], dim=1)
        return (gates.unsqueeze(-1) * expert_outputs).sum(1)


def train(model, loader, epochs=1):
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.NLLLoss()
    for _ in range(epochs):
        for x, y in loader:
            optim.zero_grad()
            loss = loss_fn(torch.log(model(x) + 1e-9), y)
            loss.backward()
            optim.step()


torch.manual_seed(0)
model = MoE(input_size=4, output_size=3, num_experts=3, hidden_size=5)
train(model, [(torch.randn(6, 4), torch.randint(0, 3, (6,)))])
