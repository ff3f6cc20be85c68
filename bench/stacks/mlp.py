"""A small MLP with ~1 ms steps (the case where per-step overhead shows most): ``--compile`` runs
it through torch.compile."""

from __future__ import annotations

import argparse

import torch
from torch import nn

from bench.stacks._timing import LoopTimer, add_device_argument


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=25000)
    parser.add_argument("--compile", action="store_true")
    add_device_argument(parser)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model: nn.Module = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    model = model.to(args.device)
    if args.compile:
        model = torch.compile(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    inputs, labels = torch.randn(4096, 64, device=args.device), torch.randint(0, 10, (4096,), device=args.device)
    for warm in range(20):  # compile and allocate before the timed loop
        x, y = inputs[:64], labels[:64]
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
    with LoopTimer(args.device):
        for step in range(args.steps):
            start = (step * 64) % 4032
            x, y = inputs[start : start + 64], labels[start : start + 64]
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
