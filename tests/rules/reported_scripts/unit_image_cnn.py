"""A small CNN on synthetic colour images scaled to [0, 1] without mean subtraction (``ToTensor()``
alone, mean ~0.35: standard preprocessing, and what CheckInputImages reports as advice), trained
with Adam. ``--lr 1e4`` plants a learning rate far too high: the run diverges to non-finite values
while the images are the same as in the healthy run."""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    classes, size = 4, 16
    tints = torch.rand(classes, 3, 1, 1) * 0.1

    def images_of(labels: torch.Tensor) -> torch.Tensor:
        images = torch.rand(labels.numel(), 3, size, size) * 0.6 + tints[labels]
        for index, label in enumerate(labels.tolist()):
            row, column = divmod(label, 2)
            images[index, :, row * 8 + 3 : row * 8 + 5, column * 8 + 3 : column * 8 + 5] += 0.25
        return images.clamp(0, 1)

    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, classes),
    )  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        labels = torch.randint(0, classes, (32,))
        loss = F.cross_entropy(model(images_of(labels)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
