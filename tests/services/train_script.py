"""A plain PyTorch training script (no trainguard code) for the service tests.

``--blowup-at N`` plants a fault: from step N the learning rate is multiplied by 1e12, so the
loss explodes. ``--step-seconds`` slows the loop so a job is still running when a rule fires.
``--saturate``: a tanh layer whose weights are 500 times too large, so its inputs sit in tanh's flat
region (what SaturatedActivation finds).
"""

import argparse
import time

import torch
import torch.nn as nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--blowup-at", type=int, default=-1)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--saturate", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh() if args.saturate else nn.ReLU(), nn.Linear(8, 1))
    if args.saturate:
        with torch.no_grad():
            model[0].weight.mul_(500.0)
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(32, 4)
    targets = inputs.sum(dim=1, keepdim=True)
    for step in range(args.steps):
        if step == args.blowup_at:
            for group in optimizer.param_groups:
                group["lr"] *= 1e12
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4g}", flush=True)
        if args.step_seconds:
            time.sleep(args.step_seconds)
    raise SystemExit(args.exit_code)


if __name__ == "__main__":
    main()
