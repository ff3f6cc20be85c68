"""A plain PyTorch script whose loss is a function call, F.cross_entropy: no loss module.

No trainguard code. Capture it with:

    trainguard run --out runs/functional -- python examples/zero_code/functional_loss.py
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(4)
    model = nn.Sequential(nn.Linear(8, 24), nn.GELU(), nn.Linear(24, 5))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(args.steps):
        x = torch.randn(24, 8, generator=generator)
        y = torch.randint(0, 5, (24,), generator=generator)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
        optimizer.step()
        print(f"train_loss {step} {loss.item().hex()}", flush=True)
    print(f"optimizer_steps {args.steps}")


if __name__ == "__main__":
    main()
