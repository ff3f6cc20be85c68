"""A capture disk that fills up mid-run (a real 1 MiB tmpfs): training goes on, and the hook still
records, in the space it held back at start, that capture stopped, at which step and why, and
writes the end marker, so that readers and rules know the run is truncated. Needs root (mount)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import trainguard.pytorch as tg  # noqa: E402
from tests.reliability.faults import mount_small_disk, unmount  # noqa: E402
from trainguard.format.layout import END_OF_TRAINING  # noqa: E402
from trainguard.trial import create_trial  # noqa: E402

STEPS = 40


def test_full_capture_disk_is_recorded_in_the_space_held_back(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs as the capture disk")
    run = tmp_path / "run"
    try:
        mount_small_disk(run, mib=1)
    except OSError as error:
        pytest.skip(str(error))
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        # every step saves ~0.5 MiB of raw weights and gradients: the 1 MiB disk fills in a few steps
        hook = tg.Hook(out_dir=str(run), include_collections=["weights", "gradients", "losses"],
                       save_config=tg.SaveConfig(save_interval=1))  # fmt: skip
        hook.register_module(model)
        loss_fn = torch.nn.CrossEntropyLoss()
        hook.register_loss(loss_fn)
        assert (run / ".trainguard-reserve-worker_0").exists() is False  # held back once writing starts
        for _ in range(STEPS):
            optimizer.zero_grad()
            loss = loss_fn(model(torch.randn(8, 256)), torch.randint(0, 2, (8,)))
            loss.backward()
            optimizer.step()
        hook._writer.flush(30)  # a writer process may still be behind: what it wrote by now
        assert hook.enabled is False  # the full disk disabled capture; training ran every step
        hook.close()

        stopped = json.loads((run / "capture_stopped" / "worker_0.json").read_text())
        assert "disk is full" in stopped["reason"] and 0 < stopped["step"] < STEPS
        assert (run / END_OF_TRAINING).exists()
        assert not list(run.glob(".trainguard-reserve-*"))  # the space held back was used or freed
        trial = create_trial(str(run))
        assert trial.training_ended and set(trial.capture_stopped()) == {"worker_0"}
        assert trial.steps() and max(trial.steps()) < stopped["step"] + 1
    finally:
        unmount(run)


def test_the_space_held_back_is_freed_by_a_normal_close(tmp_path: Path) -> None:
    hook = tg.Hook(out_dir=str(tmp_path), include_collections=["losses"], save_config=tg.SaveConfig(save_interval=1))
    model = torch.nn.Linear(4, 1)
    hook.register_module(model)
    model(torch.randn(2, 4)).sum().backward()
    hook.end_step()
    assert (tmp_path / ".trainguard-reserve-worker_0").stat().st_size == 64 << 10
    hook.close()
    assert not list(tmp_path.glob(".trainguard-reserve-*")) and (tmp_path / END_OF_TRAINING).exists()
    assert create_trial(str(tmp_path)).capture_stopped() == {}
