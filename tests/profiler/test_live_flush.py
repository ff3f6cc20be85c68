"""Step timings reach the run while it goes on, and all of them before the end marker.

Live profiler rules read the run while it trains and stop at the end-of-training marker: a
timeline that is only closed every minute, or after the marker, hides a short job's stalls.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import trainguard.pytorch as tg
from tests.profiler._loops import small_model
from trainguard.format.layout import END_OF_TRAINING
from trainguard.profiler import Profiler, read_step_timings
from trainguard.profiler.core import DEFAULT_FLUSH_S
from trainguard.rules import RuleSpec, create_rule

STALLED_SCRIPT = """
import sys, time
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(32 * 16, 1, 28, 28), torch.randint(0, 10, (32 * 16,)))
def slow_collate(batch):
    time.sleep(0.3)  # an input pipeline that cannot keep up
    return torch.utils.data.default_collate(batch)
for x, y in DataLoader(data, batch_size=16, collate_fn=slow_collate):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("trained", flush=True)
"""


def test_default_flush_is_seconds_not_a_minute() -> None:
    assert DEFAULT_FLUSH_S <= 10


def _train(hook: tg.Hook, steps: int) -> None:
    """``steps`` training steps of the tiny model, registered with ``hook``."""
    import torch

    model = small_model("tiny")
    hook.register_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x, y = torch.randn(4, 1, 28, 28, generator=generator), torch.randint(0, 10, (4,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_hook_close_writes_every_step_timing_before_the_end_marker(tmp_path: Path) -> None:
    # A rotation interval far longer than the job: without the flush at close, nothing would be
    # written until profiler.stop(), after the end marker.
    profiler = Profiler(tmp_path, interval_ms=100, system=False, rotate_interval_s=600).start()
    try:
        hook = tg.Hook(out_dir=tmp_path, save_config=tg.SaveConfig(save_interval=1), include_collections=["losses"])
        _train(hook, 6)
        assert read_step_timings(tmp_path) == []  # still in memory: the interval is not over
        hook.close()
        assert (tmp_path / END_OF_TRAINING).exists()
        seen_at_end = [s.step for s in read_step_timings(tmp_path) if s.mode == "TRAIN"]
    finally:
        profiler.stop()
    assert seen_at_end == list(range(6))


@pytest.mark.slow
def test_stall_in_a_ten_second_job_is_seen_by_a_live_rule(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(STALLED_SCRIPT)
    run = tmp_path / "run"
    environment = {**os.environ, "TRAINGUARD_PROFILER": "1", "TRAINGUARD_PROFILER_INTERVAL_MS": "200"}
    environment.pop("TRAINGUARD_ZERO_CODE", None)
    command = [sys.executable, "-m", "trainguard.cli", "run", "--out", str(run), "--", sys.executable, str(script)]
    process = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    fired_while_running = None
    try:
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(1.0)
            if (run / END_OF_TRAINING).exists() or not read_step_timings(run):
                continue
            result = create_rule(str(run), RuleSpec.parse("Dataloader")).finish()
            if result is not None and result.fired and not (run / END_OF_TRAINING).exists():
                fired_while_running = result
                break
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-3000:]
    assert "trained" in stdout
    assert fired_while_running is not None, "the stall was not visible before the job ended"
    assert "waiting for data" in fired_while_running.message


def test_every_worker_writes_its_step_timings_before_its_end_key(tmp_path: Path) -> None:
    """Worker 0 writes the end marker once the others' end keys are there: a rank that flushed
    only at exit left the rules comparing ranks (Straggler) with one rank's timings."""
    from trainguard.format.layout import worker_end_key

    profiler = Profiler(tmp_path, interval_ms=100, system=False, rotate_interval_s=600, rank=1).start()
    try:
        hook = tg.Hook(out_dir=tmp_path, save_config=tg.SaveConfig(save_interval=1), include_collections=["losses"])
        hook._rank_and_world = lambda: (1, 2)  # type: ignore[method-assign]  # rank 1 of 2, no process group
        _train(hook, 4)
        hook.close()
        assert (tmp_path / worker_end_key("worker_1")).exists()
        seen_at_end = [s.step for s in read_step_timings(tmp_path) if s.mode == "TRAIN"]
    finally:
        profiler.stop()
    assert seen_at_end == list(range(4))
