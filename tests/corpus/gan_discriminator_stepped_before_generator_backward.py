# A GAN fitting sin(x): one forward of D on the generated paintings feeds both losses; the loop runs
# D_loss.backward(retain_graph=True), opt_D.step(), then G_loss.backward(). The step updates D's
# weights in place, and G_loss's graph saved them (D's linears need them for the input gradient).
# expect: saved-tensor-modified
# outcome: raises RuntimeError
import math

import torch
import torch.nn as nn

BATCH_SIZE = 4
N_IDEAS = 5
ART_COMPONENTS = 6
PAINT_POINTS = torch.linspace(-1, 1, ART_COMPONENTS).repeat(BATCH_SIZE, 1)


def artist_works():
    r = 0.02 * torch.randn(1, ART_COMPONENTS)
    return torch.sin(PAINT_POINTS * math.pi) + r


torch.manual_seed(0)
G = nn.Sequential(nn.Linear(N_IDEAS, 8), nn.ReLU(), nn.Linear(8, ART_COMPONENTS))
D = nn.Sequential(nn.Linear(ART_COMPONENTS, 8), nn.ReLU(), nn.Linear(8, 1), nn.Sigmoid())
opt_D = torch.optim.Adam(D.parameters(), lr=0.0001)
opt_G = torch.optim.Adam(G.parameters(), lr=0.0001)

for step in range(2):
    artist_paintings = artist_works()
    G_ideas = torch.randn(BATCH_SIZE, N_IDEAS)
    G_paintings = G(G_ideas)
    prob_artist0 = D(artist_paintings)
    prob_artist1 = D(G_paintings)  # @saved
    D_loss = -torch.mean(torch.log(prob_artist0) + torch.log(1. - prob_artist1))
    G_loss = torch.mean(torch.log(1. - prob_artist1))

    opt_D.zero_grad()
    D_loss.backward(retain_graph=True)
    opt_D.step()  # @culprit
    opt_G.zero_grad()
    G_loss.backward()
    opt_G.step()
