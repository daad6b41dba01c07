# pytorch/pytorch#140469: dataset distillation makes its synthetic images with
# `torch.randn(..., requires_grad=True) * 0.01` and hands them to an optimizer; the product is not
# a leaf (the leaf is the randn before the scaling), and the optimizer refuses it. The answer: keep
# the leaf and scale it without recording (or scale before setting requires_grad).
# expect: nonleaf-optimized tensor=image_syn
# outcome: raises ValueError
import torch

num_classes, ipc, channel, im_size = 3, 2, 1, (4, 4)
image_syn = torch.randn(size=(num_classes * ipc, channel, im_size[0], im_size[1]), dtype=torch.float,  # @culprit
                        requires_grad=True) * 0.01
label_syn = torch.arange(num_classes).repeat_interleave(ipc)
optimizer_img = torch.optim.SGD([image_syn, ], lr=0.1, momentum=0.5)  # @saved
