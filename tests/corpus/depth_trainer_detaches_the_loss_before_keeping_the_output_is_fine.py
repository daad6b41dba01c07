# packnet-sfm's HorovodTrainer.train after its fix: the loss is detached before the batch's output
# dict goes into `outputs` for training_epoch_end, so the list keeps detached losses and no graph.
# expect: none
# outcome: ok
import torch
from torch import nn


def average_loss_and_metrics(batch_list, prefix):
    values = torch.stack([output["loss"] for output in batch_list])
    return {prefix + "-loss": values.mean().item()}


class SelfSupModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.depth_net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 1, 3, padding=1))

    def training_step(self, batch, *args):
        inv_depth = torch.sigmoid(self.depth_net(batch["rgb"]))
        photometric = (inv_depth - batch["target"]).abs().mean()
        smoothness = (inv_depth[..., 1:] - inv_depth[..., :-1]).abs().mean()
        return {"loss": photometric + 0.1 * smoothness, "metrics": {}}

    def training_epoch_end(self, output_batch):
        return average_loss_and_metrics(output_batch, "avg_train")


class HorovodTrainer:
    def train(self, dataloader, module, optimizer):
        module.train()
        outputs = []
        for i, batch in enumerate(dataloader):
            optimizer.zero_grad()
            output = module.training_step(batch, i)
            output["loss"].backward()
            optimizer.step()
            output["loss"] = output["loss"].detach()
            outputs.append(output)
        return module.training_epoch_end(outputs)


torch.manual_seed(0)
model = SelfSupModel()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loader = [{"rgb": torch.randn(1, 3, 4, 4), "target": torch.rand(1, 1, 4, 4)} for _ in range(3)]
HorovodTrainer().train(loader, model, optimizer)
