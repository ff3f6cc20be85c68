"""A healthy PyTorch training run: a small CNN on synthetic 28x28 "digits", with validation.

Plain PyTorch, no trainguard code. Under the default rules it completes with no findings:

    trainguard run --rules --stop-on-issue -- python examples/healthy/mnist_like_cnn.py
"""

import argparse

import torch
import torch.nn as nn


def make_model() -> nn.Module:
    # ReLU as modules (not F.relu) so the hook sees the activations DeadRelu checks.
    return nn.Sequential(
        nn.Conv2d(1, 8, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def synthetic_digits(
    count: int, templates: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Learnable data: each class is a fixed random template plus noise."""
    labels = torch.randint(0, 10, (count,), generator=generator)
    images = templates[labels] + 0.8 * torch.randn(count, 1, 28, 28, generator=generator)
    return images, labels


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--train-size", type=int, default=2048)
    args = parser.parse_args()

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    templates = torch.randn(10, 1, 28, 28, generator=generator)
    train_x, train_y = synthetic_digits(args.train_size, templates, generator)
    val_x, val_y = synthetic_digits(512, templates, generator)
    model = make_model()
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
        correct, val_loss = 0, 0.0
        with torch.no_grad():
            for start in range(0, len(val_x), 128):
                logits = model(val_x[start : start + 128])
                val_loss += criterion(logits, val_y[start : start + 128]).item()
                correct += (logits.argmax(1) == val_y[start : start + 128]).sum().item()
        print(f"epoch {epoch}: train loss {loss.item():.3f}, val accuracy {correct / len(val_x):.3f}", flush=True)


if __name__ == "__main__":
    main()
