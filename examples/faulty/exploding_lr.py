"""A faulty PyTorch training run: the learning rate is far too high, so training diverges.

Plain PyTorch, no trainguard code: an MLP regressing a noisy linear target with SGD at
``lr=0.5`` (a sane value is 0.01). Within a few steps the loss overflows to inf and the weights
turn NaN; the script would still go on for all of its epochs. Under the default rules trainguard
detects it and stops the job long before that:

    trainguard run --rules --stop-on-issue -- python examples/faulty/exploding_lr.py
"""

import argparse
import math
import time

import torch
import torch.nn as nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.5, help="the bug: a sane value is 0.01")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(0)
    inputs = torch.randn(4096, 64)
    target = inputs @ torch.randn(64, 1) + 0.1 * torch.randn(4096, 1)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    criterion = nn.MSELoss()

    step, diverged = 0, False
    started = time.time()
    for epoch in range(args.epochs):
        for start in range(0, len(inputs), args.batch_size):
            x, y = inputs[start : start + args.batch_size], target[start : start + args.batch_size]
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if not diverged and not math.isfinite(loss.item()):
                print(f"step {step}: loss is {loss.item()} ({time.time() - started:.1f} s in)", flush=True)
                diverged = True
            step += 1
        print(f"epoch {epoch}: step {step}, train loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
