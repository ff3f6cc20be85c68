"""A plain MLP loop without validation on noisy mini-batches (batch 16, 15 % flipped labels): the
loop LossNotDecreasing used to stop at step 60 because one mini-batch loss rose."""

from __future__ import annotations

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x = torch.randn(4096, 20)
    y = (x[:, :3].sum(dim=1) > 0).long()
    flip = torch.rand(4096) < 0.15
    y[flip] = 1 - y[flip]
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    for step in range(args.steps):
        batch = torch.randint(0, 4096, (16,))
        optimizer.zero_grad()
        loss = criterion(model(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
