# SparseLLM's alternating MLP pruning (issue 13): the update of the auxiliary gate outputs `s` makes
# each mini-batch a leaf with requires_grad_(True), takes its gradient under enable_grad, and steps it
# with `s_batch -= s_learning_rate * s_batch.grad`. Run without the @torch.no_grad() the repository's
# llama_sequential has, that step is an in-place op on a leaf that requires grad.
# expect: leaf-inplace tensor=s_batch
# outcome: raises RuntimeError
import torch
import torch.nn as nn


class GPTHolder:
    def __init__(self, layer):
        self.layer = layer


class LlamaMLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)


class DecoderLayer(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.mlp = LlamaMLP(hidden, inter)


def find_layers(module):
    return {name: m for name, m in module.named_modules() if isinstance(m, nn.Linear)}


def optimize_mlp(subset, gpts, X, Y, s, z, p, adagp_epochs=2, alpha=5.0, beta=5.0, gamma=5.0):
    Xinv = torch.pinverse(X.to(dtype=torch.float32)).half()
    training_loss = []
    for adagp_step in range(adagp_epochs):
        if adagp_step > 0:
            gpts['mlp.up_proj'].layer.weight.copy_(torch.matmul(z, Xinv).float())
            pinv = torch.pinverse(p.to(dtype=torch.float32)).half()
            gpts['mlp.down_proj'].layer.weight.copy_(torch.matmul(Y, pinv).float())
            gpts['mlp.gate_proj'].layer.weight.copy_(torch.matmul(s, Xinv).float())

        next_weight = subset['mlp.down_proj'].weight
        m1 = beta * torch.matmul(next_weight.T, next_weight)
        av = torch.inverse(m1 + gamma * torch.eye(m1.shape[0])).to(dtype=torch.float16)
        af = beta * torch.matmul(next_weight.T, Y.float()) + gamma * nn.functional.silu(s.float()) * z.float()
        p = torch.matmul(av.float(), af).half()

        w = subset['mlp.up_proj'].weight
        swish = nn.functional.silu(s.float())
        z = ((torch.matmul(w, X.float()) + swish * p.float()) / (swish ** 2 + 1)).half()

        w = subset['mlp.gate_proj'].weight
        w = w.to(dtype=torch.float32).requires_grad_(True)
        s_learning_rate = 0.01
        for _ in range(2):
            batch_size = 3
            for k in range(0, s.size(-1), batch_size):
                chunk = slice(k, k + batch_size)
                X_batch = X[:, chunk].to(dtype=torch.float32).requires_grad_(True)
                z_batch = z[:, chunk].to(dtype=torch.float32).requires_grad_(True)
                p_batch = p[:, chunk].to(dtype=torch.float32).requires_grad_(True)
                s_batch = s[:, chunk].to(dtype=torch.float32).requires_grad_(True)
                with torch.enable_grad():
                    loss_s = alpha * torch.norm(s_batch - torch.matmul(w, X_batch)) ** 2
                    loss_s += gamma * torch.norm(p_batch - nn.functional.silu(s_batch) * z_batch) ** 2
                loss_s.backward()
                s_batch -= s_learning_rate * s_batch.grad  # @culprit
                s_batch.grad.zero_()
                s[:, chunk] = s_batch.detach().to(dtype=torch.float16)
        training_loss.append(nn.functional.mse_loss(
            torch.matmul(subset['mlp.down_proj'].weight,
                         nn.functional.silu(torch.matmul(subset['mlp.gate_proj'].weight, X.float()))
                         * torch.matmul(subset['mlp.up_proj'].weight, X.float())), Y.float()).item())
    return training_loss


torch.manual_seed(0)
hidden, inter, n = 4, 6, 6
layer = DecoderLayer(hidden, inter)
subset = find_layers(layer)
gpts = {name: GPTHolder(layer) for name, layer in subset.items()}
X = torch.randn(hidden, n).half()
with torch.no_grad():
    s = torch.matmul(subset['mlp.gate_proj'].weight, X.float()).half()
    z = torch.matmul(subset['mlp.up_proj'].weight, X.float()).half()
    p = (nn.functional.silu(s.float()) * z.float()).half()
    Y = torch.matmul(subset['mlp.down_proj'].weight, p.float()).half()
losses = optimize_mlp(subset, gpts, X, Y, s, z, p)
