"""A healthy GAN on a 2-D mixture of four Gaussians (two optimizers, alternating steps).

Its discriminator loss rises towards equilibrium as the generator learns; ``--lr`` far too high
makes it diverge to NaN. No trainguard code: run under ``trainguard run``.
"""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1500)
parser.add_argument("--lr", type=float, default=2e-4)
args = parser.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)


def real(n: int) -> torch.Tensor:
    centers = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0], [0.0, -2.0]])
    return centers[torch.randint(0, 4, (n,))] + 0.1 * torch.randn(n, 2)


generator = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
discriminator = nn.Sequential(
    nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1)
)
g_optimizer = torch.optim.Adam(generator.parameters(), lr=args.lr, betas=(0.5, 0.999))
d_optimizer = torch.optim.Adam(discriminator.parameters(), lr=args.lr, betas=(0.5, 0.999))
bce = nn.BCEWithLogitsLoss()
for _ in range(args.steps):
    x, z = real(128), torch.randn(128, 8)
    d_optimizer.zero_grad()
    d_loss = bce(discriminator(x), torch.ones(128, 1)) + bce(discriminator(generator(z).detach()), torch.zeros(128, 1))
    d_loss.backward()
    d_optimizer.step()
    g_optimizer.zero_grad()
    g_loss = bce(discriminator(generator(z)), torch.ones(128, 1))
    g_loss.backward()
    g_optimizer.step()
print(f"done d_loss {d_loss.item():.4f} g_loss {g_loss.item():.4f}")
