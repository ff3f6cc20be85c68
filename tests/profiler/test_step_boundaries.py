"""Where the framework profiler puts step boundaries in loops of different shapes."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from tests.profiler._loops import small_model
from trainguard.profiler import Profiler, read_step_timings


def _data(n: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(n, 1, 28, 28, generator=generator), torch.randint(0, 10, (n,), generator=generator)
    )


def _steps(run: Path) -> list[tuple[str, int]]:
    return [(s.mode, s.step) for s in read_step_timings(run)]


def test_train_then_eval_epochs(tmp_path: Path) -> None:
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters())
    with Profiler(tmp_path, system=False):
        for _ in range(2):
            model.train()
            for x, y in DataLoader(_data(), batch_size=16):
                loss = nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                for x, _ in DataLoader(_data(32), batch_size=16):
                    model(x)
    assert _steps(tmp_path) == [("TRAIN", i) for i in range(4)] + [("EVAL", 0), ("EVAL", 1)] + [
        ("TRAIN", i) for i in range(4, 8)
    ] + [("EVAL", 2), ("EVAL", 3)]
    evals = [s for s in read_step_timings(tmp_path) if s.mode == "EVAL"]
    assert all(s.backward == 0 and s.optimizer == 0 and s.forward > 0 for s in evals)


def test_loop_without_torch_optim_and_without_dataloader(tmp_path: Path) -> None:
    """Manual SGD on tensors: each backward ends a step; data = gap before the forward."""
    model = small_model()
    x, y = _data(16).tensors
    with Profiler(tmp_path, system=False):
        for _ in range(5):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter -= 0.01 * parameter.grad
                    parameter.grad = None
    steps = read_step_timings(tmp_path)
    assert [(s.mode, s.step) for s in steps] == [("TRAIN", i) for i in range(5)]
    assert all(s.optimizer == 0 and s.backward > 0 and s.dataloader_workers is None for s in steps)


def test_two_optimizers_make_one_step(tmp_path: Path) -> None:
    generator, critic = nn.Linear(8, 784), small_model()
    optimizers = [torch.optim.SGD(generator.parameters(), lr=0.01), torch.optim.SGD(critic.parameters(), lr=0.01)]
    with Profiler(tmp_path, system=False):
        for _ in range(3):
            fake = generator(torch.randn(4, 8)).view(4, 1, 28, 28)
            loss = critic(fake).mean()
            for optimizer in optimizers:
                optimizer.zero_grad()
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
    steps = read_step_timings(tmp_path)
    assert [(s.mode, s.step) for s in steps] == [("TRAIN", i) for i in range(3)]
    assert all(s.optimizer > 0 for s in steps)
