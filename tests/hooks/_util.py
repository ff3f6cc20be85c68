"""Shared pieces of the hook tests: small seeded models and training loops."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

REPO = Path(__file__).resolve().parents[2]
ZERO_CODE_EXAMPLES = REPO / "examples" / "zero_code"
PYTHON = sys.executable

PARAMS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


class Net(nn.Module):
    """Root class ``Net``: tensor names ``Net_fc1.weight``, ``fc1_output_0``..."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x)))


def batches(count: int, *, seed: int = 1, size: int = 16, dtype: torch.dtype = torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, 4, generator=generator).to(dtype), torch.randint(0, 3, (size,), generator=generator))
        for _ in range(count)
    ]


def seeded_model(seed: int = 0, dtype: torch.dtype = torch.float32) -> Net:
    torch.manual_seed(seed)
    return Net().to(dtype)


def as_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()
