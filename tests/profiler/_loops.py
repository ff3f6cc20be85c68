"""Small real PyTorch training loops for the profiler tests (CPU, seconds each)."""

from __future__ import annotations

import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


class SlowDataset(Dataset):
    """A dataset whose every item takes ``delay_s`` to produce (a slow disk or decoder)."""

    def __init__(self, n: int, delay_s: float) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 1, 28, 28, generator=generator)
        self.y = torch.randint(0, 10, (n,), generator=generator)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        time.sleep(self.delay_s)
        return self.x[index], self.y[index]


def small_model(kind: str = "conv") -> nn.Module:
    """``conv``: compute clearly dominates an in-memory batch; ``tiny``: ~1 ms steps."""
    torch.manual_seed(0)
    if kind == "tiny":
        return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))
    return nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 13 * 13, 10))


def train(
    steps: int,
    *,
    batch: int = 32,
    item_delay_s: float = 0.0,
    slow_steps: frozenset[int] = frozenset(),
    slow_step_s: float = 0.0,
    model_kind: str = "conv",
) -> None:
    """``steps`` SGD steps; ``item_delay_s`` slows the Dataset, ``slow_steps`` sleep inside the step."""
    model = small_model(model_kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    if item_delay_s:
        dataset: Dataset = SlowDataset(steps * batch, item_delay_s)
    else:
        generator = torch.Generator().manual_seed(0)
        dataset = TensorDataset(torch.randn(steps * batch, 1, 28, 28, generator=generator),
                                torch.randint(0, 10, (steps * batch,), generator=generator))  # fmt: skip
    for index, (x, y) in enumerate(DataLoader(dataset, batch_size=batch)):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        if index in slow_steps:
            time.sleep(slow_step_s)
        optimizer.step()
