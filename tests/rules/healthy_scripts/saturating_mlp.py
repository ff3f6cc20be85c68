"""A 3-hidden-layer tanh or sigmoid MLP classifier, initialised N(0, std²) or with Xavier.

``python saturating_mlp.py tanh|sigmoid normal|xavier [--std 3] [--steps 60] [--lr 0.05]``. With
N(0, 3²) the pre-activations have a standard deviation of 10-25: most of them sit where the
activation is flat from the first step. No trainguard code: run under ``trainguard run``.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("activation", choices=["tanh", "sigmoid"])
parser.add_argument("init", choices=["normal", "xavier"])
parser.add_argument("--std", type=float, default=3.0)
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
Activation = nn.Tanh if args.activation == "tanh" else nn.Sigmoid
layers = [nn.Linear(20, 64), Activation(), nn.Linear(64, 64), Activation(), nn.Linear(64, 64), Activation()]
model = nn.Sequential(*layers, nn.Linear(64, 4))
for module in model:
    if isinstance(module, nn.Linear):
        if args.init == "xavier":
            nn.init.xavier_uniform_(module.weight)
        else:
            nn.init.normal_(module.weight, 0.0, args.std)
        nn.init.zeros_(module.bias)
x = torch.randn(4096, 20)
y = (x @ torch.randn(20, 4)).argmax(1)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
for _ in range(args.steps):
    batch = torch.randint(0, 4096, (64,))
    loss = F.cross_entropy(model(x[batch]), y[batch])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
with torch.no_grad():
    accuracy = (model(x).argmax(1) == y).float().mean().item()
print(f"done loss {loss.item():.3f} accuracy {accuracy:.3f}")
