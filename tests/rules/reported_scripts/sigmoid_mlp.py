"""A sigmoid MLP classifier trained with plain SGD (the classic tutorial network). At a sane
learning rate it learns; at lr=100 the first updates saturate the sigmoids (their gradients
vanish) and then overflow: the cause is the learning rate, the vanished gradient a consequence."""

from __future__ import annotations

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x = torch.randn(2048, 16)
    y = (x[:, :4].sum(dim=1) > 0).long()
    model = nn.Sequential(nn.Linear(16, 64), nn.Sigmoid(), nn.Linear(64, 64), nn.Sigmoid(), nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    criterion = nn.CrossEntropyLoss()
    for step in range(args.steps):
        batch = torch.randint(0, 2048, (32,))
        optimizer.zero_grad()
        loss = criterion(model(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
