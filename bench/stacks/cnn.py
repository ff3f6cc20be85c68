"""The reference CNN (MNIST-shaped, two conv layers), as in bench/overhead.py."""

from __future__ import annotations

import argparse

import torch
from torch import nn

from bench.stacks._timing import LoopTimer, add_device_argument


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    add_device_argument(parser)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10),
    ).to(args.device)  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    images, labels = torch.randn(2048, 1, 28, 28, device=args.device), torch.randint(0, 10, (2048,), device=args.device)
    with LoopTimer(args.device):
        for step in range(args.steps):
            start = (step * 64) % 1984
            optimizer.zero_grad()
            loss = criterion(model(images[start : start + 64]), labels[start : start + 64])
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
