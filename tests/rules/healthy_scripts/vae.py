"""A healthy VAE: encoder, mean and log-variance heads on its output, decoder (four root modules)."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1500)
args = parser.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
data = torch.rand(2048, 32)
encoder = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
mean_head, log_variance_head = nn.Linear(64, 4), nn.Linear(64, 4)
decoder = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 32))
parameters = [*encoder.parameters(), *mean_head.parameters(), *log_variance_head.parameters(), *decoder.parameters()]
optimizer = torch.optim.Adam(parameters, lr=1e-3)
for step in range(args.steps):
    start = (step * 64) % 1984
    x = data[start : start + 64]
    hidden = encoder(x)
    mean, log_variance = mean_head(hidden), log_variance_head(hidden)
    z = mean + torch.randn_like(mean) * (0.5 * log_variance).exp()
    reconstruction = ((decoder(z) - x) ** 2).sum(1).mean()
    divergence = (-0.5 * (1 + log_variance - mean**2 - log_variance.exp()).sum(1)).mean()
    loss = reconstruction + divergence
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"done loss {loss.item():.4f}")
