"""A plain PyTorch training script: a small CNN on synthetic 28x28 digits, with validation.

It contains no trainguard code. Run it under capture with:

    trainguard run -- python examples/train_mnist_cnn.py
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3)
        self.conv2 = nn.Conv2d(16, 32, 3)
        self.fc1 = nn.Linear(32 * 5 * 5, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def synthetic_digits(
    count: int, templates: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Learnable synthetic data: each class is a fixed random template plus noise."""
    labels = torch.randint(0, 10, (count,), generator=generator)
    images = templates[labels] + 0.8 * torch.randn(count, 1, 28, 28, generator=generator)
    return images, labels


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    templates = torch.randn(10, 1, 28, 28, generator=generator)
    train_x, train_y = synthetic_digits(2048, templates, generator)
    val_x, val_y = synthetic_digits(512, templates, generator)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        model.train()
        for start in range(0, len(train_x), args.batch_size):
            x, y = train_x[start : start + args.batch_size], train_y[start : start + args.batch_size]
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        model.eval()
        correct = 0
        with torch.no_grad():
            for start in range(0, len(val_x), 256):
                logits = model(val_x[start : start + 256])
                correct += (logits.argmax(1) == val_y[start : start + 256]).sum().item()
        print(f"epoch {epoch}: train loss {loss.item():.3f}, val accuracy {correct / len(val_x):.3f}")


if __name__ == "__main__":
    main()
