# SegLossOdyssey's HDDTBinaryLoss: the distance maps of the thresholded prediction and of the
# ground truth are computed under torch.no_grad() from `.cpu()` copies, which cuts them off the
# graph on purpose; they only weight the squared error (gt - pc) ** 2, which keeps its gradient.
# expect: none
# outcome: ok
import torch
from torch import nn


def softmax_helper(x):
    return torch.softmax(x, dim=1)


def compute_edts_forhdloss(segmentation):
    # brute-force Euclidean distance transform of each foreground and background region
    res = torch.zeros(segmentation.shape)
    for i in range(segmentation.shape[0]):
        posmask = segmentation[i]
        coords = torch.stack(torch.meshgrid(*[torch.arange(s) for s in posmask.shape], indexing="ij"), -1)
        coords = coords.reshape(-1, posmask.dim()).float()
        flat = posmask.reshape(-1)
        if flat.any() and (~flat).any():
            d = torch.cdist(coords, coords)
            to_bg = d[:, ~flat].min(1).values
            to_fg = d[:, flat].min(1).values
            res[i] = torch.where(flat, to_bg, to_fg).reshape(posmask.shape)
    return res


class HDDTBinaryLoss(nn.Module):
    def forward(self, net_output, target):
        net_output = softmax_helper(net_output)
        pc = net_output[:, 1, ...].type(torch.float32)
        gt = target[:, 0, ...].type(torch.float32)
        with torch.no_grad():
            pc_dist = compute_edts_forhdloss(pc.cpu() > 0.5)
            gt_dist = compute_edts_forhdloss(gt.cpu() > 0.5)
        pred_error = (gt - pc) ** 2
        dist = pc_dist ** 2 + gt_dist ** 2
        dist = dist.to(device=pred_error.device, dtype=torch.float32)
        multipled = torch.einsum("bxy,bxy->bxy", pred_error, dist)
        return multipled.mean()


torch.manual_seed(0)
net = nn.Conv2d(1, 2, 3, padding=1)
criterion = HDDTBinaryLoss()
image = torch.randn(2, 1, 5, 5)
target = (torch.rand(2, 1, 5, 5) > 0.5).float()
loss = criterion(net(image), target)
loss.backward()
