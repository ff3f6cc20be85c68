"""A plain PyTorch script: regression with nn.MSELoss and a validation pass after every epoch
(model.eval() + torch.no_grad()).

No trainguard code. Capture it with:

    trainguard run --out runs/val -- python examples/zero_code/train_with_validation.py
"""

import argparse

import torch
import torch.nn as nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-batches", type=int, default=4)
    parser.add_argument("--val-batches", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(3)
    true_w = torch.randn(6, 2, generator=generator)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(20, 6, generator=generator)
        return x, x @ true_w + 0.1 * torch.randn(20, 2, generator=generator)

    train_data = [batch() for _ in range(args.train_batches)]
    val_data = [batch() for _ in range(args.val_batches)]
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    steps = 0
    for epoch in range(args.epochs):
        model.train()
        for x, y in train_data:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            print(f"train_loss {steps} {loss.item().hex()}", flush=True)
            steps += 1
        model.eval()
        with torch.no_grad():
            for index, (x, y) in enumerate(val_data):
                val_loss = criterion(model(x), y)
                print(f"val_loss {epoch * args.val_batches + index} {val_loss.item().hex()}", flush=True)
    print(f"optimizer_steps {steps}")


if __name__ == "__main__":
    main()
