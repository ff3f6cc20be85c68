"""A plain PyTorch script with a hand-written loss, ((pred - y) ** 2).mean(): no loss module
and no loss function; the tensor backward() starts from is the loss.

No trainguard code. Capture it with:

    trainguard run --out runs/handwritten -- python examples/zero_code/handwritten_loss.py
"""

import argparse

import torch
import torch.nn as nn


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(3, 12)
        self.out = nn.Linear(12, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.sigmoid(self.hidden(x)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(5)
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        x = torch.randn(32, 3, generator=generator)
        y = x.sum(dim=1, keepdim=True) ** 2
        optimizer.zero_grad()
        pred = model(x)
        loss = ((pred - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        print(f"train_loss {step} {loss.item().hex()}", flush=True)
    print(f"optimizer_steps {args.steps}")


if __name__ == "__main__":
    main()
