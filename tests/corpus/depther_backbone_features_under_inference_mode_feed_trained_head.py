# Fine-tuning a DINOv2-style depther: the frozen ViT backbone's `get_intermediate_layers` carries
# `@torch.inference_mode()` and is bound as the backbone's forward with functools.partial, as the
# depther factory does; only the DPT-like head trains. The head's first conv tries to save the
# backbone's features for its weight gradient, and inference tensors cannot be saved.
# expect: inference-tensor-saved
# outcome: raises RuntimeError
from functools import partial

import torch
from torch import nn


class VisionTransformer(nn.Module):
    def __init__(self, embed_dim=4, depth=2):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, embed_dim, 2, 2)
        self.blocks = nn.ModuleList([nn.Conv2d(embed_dim, embed_dim, 1) for _ in range(depth)])

    @torch.inference_mode()
    def get_intermediate_layers(self, x, n=(0, 1), reshape=True):
        x = self.patch_embed(x)
        outputs = []
        for i, blk in enumerate(self.blocks):
            x = torch.relu(blk(x))  # @culprit
            if i in n:
                outputs.append(x)
        return tuple(outputs)


class DPTHead(nn.Module):
    def __init__(self, embed_dim=4, n_layers=2):
        super().__init__()
        self.project = nn.ModuleList([nn.Conv2d(embed_dim, 2, 1) for _ in range(n_layers)])
        self.depth = nn.Conv2d(2, 1, 1)

    def forward(self, feats):
        fused = sum(proj(f) for proj, f in zip(self.project, feats))  # @saved
        return torch.relu(self.depth(fused))


class DepthEncoderDecoder(nn.Module):
    def __init__(self, backbone, decode_head):
        super().__init__()
        self.backbone = backbone
        self.decode_head = decode_head

    def extract_feat(self, img):
        return self.backbone(img)

    def forward_train(self, img, depth_gt):
        x = self.extract_feat(img)
        pred = self.decode_head(x)
        return {"decode.loss_depth": nn.functional.l1_loss(pred, depth_gt)}


def create_depther(backbone_model):
    depther = DepthEncoderDecoder(backbone=backbone_model, decode_head=DPTHead())
    depther.backbone.forward = partial(backbone_model.get_intermediate_layers, n=(0, 1), reshape=True)
    return depther


torch.manual_seed(0)
backbone = VisionTransformer()
backbone.requires_grad_(False)
model = create_depther(backbone)
optimizer = torch.optim.AdamW(model.decode_head.parameters(), lr=1e-3)
losses = model.forward_train(torch.randn(2, 3, 4, 4), torch.rand(2, 1, 2, 2))
loss = sum(losses.values())
optimizer.zero_grad()
loss.backward()
optimizer.step()
