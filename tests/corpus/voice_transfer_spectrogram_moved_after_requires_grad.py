# mazzzystar/randomCNN-voice-transfer#16: the generated spectrogram is made with requires_grad=True
# and then moved to the GPU (`.cuda()`), so the tensor handed to Adam is the move's result, not the
# leaf, and the optimizer refuses it ("we can not set requires_grad=True before .cuda()"). The move
# is spelled here as a cast to float64, which copies on the CPU as .cuda() does.
# expect: nonleaf-optimized tensor=a_G_var
# outcome: raises ValueError
import torch
from torch.autograd import Variable

a_C = torch.randn(1, 8, 6)
a_G_var = Variable(torch.randn(a_C.shape) * 1e-3, requires_grad=True).double()  # @culprit
optimizer = torch.optim.Adam([a_G_var], lr=0.01)  # @saved
