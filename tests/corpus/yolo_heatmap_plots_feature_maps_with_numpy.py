# Yolo-Detect-Layer-Visualization's plot_multi_heatmap: the feature maps of the detect layers,
# taken from the model's forward, are turned into arrays with `array.cpu().numpy()` for seaborn.
# The model ran with grad on, so every map requires grad.
# expect: grad-to-numpy tensor=array
# outcome: raises RuntimeError
import torch
from torch import nn


class DetectHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.heads = nn.ModuleList([nn.Conv2d(4, 1, 1) for _ in range(2)])

    def forward(self, x):
        x = torch.relu(self.stem(x))
        return [h(x)[0, 0] for h in self.heads]  # @saved


def plot_multi_heatmap(*arrays, row=1, col=2):
    grids = []
    for i, array in enumerate(arrays):
        if isinstance(array, torch.Tensor):
            array = array.cpu().numpy()  # @culprit
        grids.append((i // col, i % col, array.mean()))
    return grids


torch.manual_seed(0)
model = DetectHead()
maps = model(torch.randn(1, 3, 6, 6))  # @saved
plot_multi_heatmap(*maps)
