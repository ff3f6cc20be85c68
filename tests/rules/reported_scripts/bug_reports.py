"""Small programs after common bug reports, each with inputs that are not normalised (raw feature
scales of 10-100, as in the reports), so the data rules advise on every one of them:

* ``--bug softmax_one_unit``: a binary classifier with one output unit, a softmax over it and
  BCELoss (a softmax over one unit is always 1: the loss never moves and no gradient flows);
* ``--bug dead_output_relu``: a regression whose last layer is followed by a ReLU while the targets
  are mostly negative (the output unit dies);
* ``--bug unscaled_targets``: a regression on targets of order 1e4 with plain SGD (the first steps
  overflow);
* ``--bug none``: the healthy program (standardised targets, two output units for two classes)."""

from __future__ import annotations

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bug", choices=["none", "softmax_one_unit", "dead_output_relu", "unscaled_targets"])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x = torch.randn(2048, 8) * torch.tensor([1.0, 3, 10, 30, 100, 1, 5, 50]) + 20  # raw feature scales
    scale = x.std(0)
    classify = args.bug in ("none", "softmax_one_unit")
    outputs = 1 if args.bug != "none" else 2
    layers: list[nn.Module] = [nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, outputs)]
    if args.bug == "dead_output_relu":
        layers.append(nn.ReLU())
    if args.bug == "softmax_one_unit":
        layers.append(nn.Softmax(dim=1))
    model = nn.Sequential(*layers)
    if classify:
        y = ((x - x.mean(0)) / scale)[:, :3].sum(1).gt(0).long()
        criterion: nn.Module = nn.CrossEntropyLoss()
        if args.bug == "softmax_one_unit":
            y, criterion = y.float()[:, None], nn.BCELoss()
    else:
        signal = ((x - x.mean(0)) / scale)[:, :3].sum(1, keepdim=True)
        y = signal * 1e4 if args.bug == "unscaled_targets" else signal - 2.0  # mostly negative targets
        criterion = nn.MSELoss()
    lr = 1e-3 if args.bug == "unscaled_targets" else 1e-4
    optimizer = torch.optim.SGD(model.parameters(), lr=lr) if args.bug == "unscaled_targets" else (
        torch.optim.Adam(model.parameters(), lr=lr * 10)
    )
    for step in range(args.steps):
        batch = torch.randint(0, 2048, (64,))
        optimizer.zero_grad()
        loss = criterion(model(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.4g}", flush=True)


if __name__ == "__main__":
    main()
