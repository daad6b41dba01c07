# yk7333/d3po#6: the training script moves the pipeline's unet to the device in the inference dtype
# (float16) for every component; with LoRA disabled, the unet's own float16 parameters are then
# trained under mixed precision, and the GradScaler refuses their float16 gradients. The fix in
# the thread keeps the unet in float32 when it is the one trained.
# expect: fp16-gradients
# outcome: raises ValueError
import torch
from torch import nn


class Pipeline:
    def __init__(self):
        self.vae = nn.Conv2d(3, 2, 1)
        self.text_encoder = nn.Embedding(10, 2)
        self.unet = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.SiLU(), nn.Conv2d(4, 2, 3, padding=1))


torch.manual_seed(0)
pipeline = Pipeline()
inference_dtype = torch.float16
pipeline.vae.to("cpu", dtype=inference_dtype)
pipeline.text_encoder.to("cpu", dtype=inference_dtype)
pipeline.unet.to("cpu", dtype=inference_dtype)  # @culprit
optimizer = torch.optim.AdamW(pipeline.unet.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
latents = (torch.randn(1, 2, 4, 4) * 0.1).to(inference_dtype)
noise_pred = pipeline.unet(latents)
loss = (noise_pred.float() ** 2).mean()
scaler.scale(loss).backward()
scaler.step(optimizer)  # @saved
scaler.update()
