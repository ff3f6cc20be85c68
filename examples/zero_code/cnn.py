"""A plain PyTorch script: a small CNN on synthetic 1x12x12 images, log_softmax + nn.NLLLoss.

No trainguard code. Capture it with:

    trainguard run --out runs/cnn -- python examples/zero_code/cnn.py
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class CNN(nn.Module):
    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 3 * 3, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        return F.log_softmax(self.fc(x.flatten(1)), dim=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(2)
    templates = torch.randn(3, 1, 12, 12, generator=generator)
    model = CNN()
    criterion = nn.NLLLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(args.steps):
        labels = torch.randint(0, 3, (16,), generator=generator)
        images = templates[labels] + 0.5 * torch.randn(16, 1, 12, 12, generator=generator)
        optimizer.zero_grad()
        loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
        print(f"train_loss {step} {loss.item().hex()}", flush=True)
    print(f"optimizer_steps {args.steps}")


if __name__ == "__main__":
    main()
