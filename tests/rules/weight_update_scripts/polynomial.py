"""Polynomial regression in the style of PyTorch's examples (regression/main.py): features x..x⁴ of
x ~ N(0, 1), a linear model fitted to coefficients of about 5, here from a small initialisation
(N(0, 0.01²) weights, zero bias), so that its weights grow a hundredfold as it converges.
``--lr`` makes the fault twin (SGD at a learning rate the x⁴ feature makes diverge)."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=600)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
torch.manual_seed(args.seed)
torch.set_num_threads(1)
DEGREE = 4
coefficients = torch.tensor([[5.0, -4.0, 3.0, 5.5]])
offset = torch.tensor([4.5])


def features(x: torch.Tensor) -> torch.Tensor:
    return torch.stack([x**power for power in range(1, DEGREE + 1)], 1)


model = nn.Linear(DEGREE, 1)
with torch.no_grad():
    model.weight.normal_(0.0, 0.01)
    model.bias.zero_()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
loss_function = nn.SmoothL1Loss()
for step in range(args.steps):
    x = features(torch.randn(64))
    y = x @ coefficients.T + offset
    loss = loss_function(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"done loss {loss.item():.5f} weights {model.weight.data.numpy().round(2)} bias {model.bias.item():.2f}")
