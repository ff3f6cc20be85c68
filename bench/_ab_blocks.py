"""What the one-process A/B benches (node_hook_ab, unsaved_hook_ab, saved_step_ab) share: their
command line and the bench MLP of bench/stacks/mlp.py (batch 64, Adam, one torch thread), built
fresh after whatever hook the bench creates first."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's trainguard


def ab_arguments(description: str, rounds: int, block: int) -> argparse.ArgumentParser:
    """A parser with --rounds and --block (training steps per timed block); add more to it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--block", type=int, default=block, help="training steps per timed block")
    return parser


def bench_mlp(samples: int = 64) -> tuple[Any, Any, Any, Any, Any]:
    """(model, optimizer, criterion, inputs, labels): ``samples`` rows of random data."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, optimizer, nn.CrossEntropyLoss(), torch.randn(samples, 64), torch.randint(0, 10, (samples,))
