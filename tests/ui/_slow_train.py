"""A small PyTorch training that takes its time, for the live dashboard tests.

``python -m tests.ui._slow_train OUT_DIR [--steps N] [--sleep S] [--lr LR]``: an MLP on a fixed
regression task, saving losses, weights and gradients at every step; ``--sleep`` seconds between
steps so that a browser watches it train.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn

import trainguard.pytorch as tg


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    torch.manual_seed(0)
    inputs = torch.randn(256, 8)
    target = inputs @ torch.randn(8, 1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    hook = tg.Hook(
        args.out_dir,
        save_config=tg.SaveConfig(save_interval=1),
        include_collections=["losses", "weights", "gradients", "relu_output"],
    )
    hook.register_module(model)
    hook.register_loss(loss_fn)
    try:
        for step in range(args.steps):
            batch = slice((step * 32) % 256, (step * 32) % 256 + 32)
            optimizer.zero_grad()
            loss_fn(model(inputs[batch]), target[batch]).backward()
            optimizer.step()
            time.sleep(args.sleep)
    finally:
        hook.close()


if __name__ == "__main__":
    main()
