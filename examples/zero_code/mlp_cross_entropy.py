"""A plain PyTorch script: an MLP classifier trained with nn.CrossEntropyLoss.

No trainguard code. Capture it with:

    trainguard run --out runs/mlp -- python examples/zero_code/mlp_cross_entropy.py

Each loss is printed exactly (float.hex) so a test can compare it with what was captured.
"""

import argparse

import torch
import torch.nn as nn


class MLP(nn.Module):
    def __init__(self, features: int = 10, hidden: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    model = MLP()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 10, generator=generator)
        y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"train_loss {step} {loss.item().hex()}", flush=True)
    print(f"optimizer_steps {args.steps}")


if __name__ == "__main__":
    main()
