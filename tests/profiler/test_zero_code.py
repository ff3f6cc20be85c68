"""``TRAINGUARD_PROFILER=1 trainguard run -- python train.py``: profiling without code changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.profiler import read_step_timings, read_system_metrics, start_from_environment

SCRIPT = """
import sys, time
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(256, 1, 28, 28), torch.randint(0, 10, (256,)))
delay = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
def slow_collate(batch):
    time.sleep(delay)  # a slow decoder
    return torch.utils.data.default_collate(batch)
for x, y in DataLoader(data, batch_size=16, collate_fn=slow_collate):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
import time; time.sleep(0.3)
print("trained")
"""


def _run(tmp_path: Path, *script_args: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    environment = {**os.environ, **env}
    environment.pop("TRAINGUARD_ZERO_CODE", None)
    command = [
        sys.executable,
        "-m",
        "trainguard.cli",
        "run",
        "--out",
        str(tmp_path / "run"),
        "--",
        sys.executable,
        str(script),
        *script_args,
    ]
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=180, cwd=tmp_path)


@pytest.mark.slow
def test_zero_code_run_writes_profiler_output(tmp_path: Path) -> None:
    done = _run(tmp_path, TRAINGUARD_PROFILER="1", TRAINGUARD_PROFILER_INTERVAL_MS="100")
    assert done.returncode == 0, done.stderr
    assert "trained" in done.stdout
    steps = [s for s in read_step_timings(tmp_path / "run") if s.mode == "TRAIN"]
    assert [s.step for s in steps] == list(range(16)) and all(s.backward > 0 for s in steps)
    assert any(m.dimension == "CPUUtilization" for m in read_system_metrics(tmp_path / "run"))


@pytest.mark.slow
def test_slow_collate_found_by_the_rule_runner(tmp_path: Path) -> None:
    """End to end: zero-code capture + profiler, then the rule runner on the finished run."""
    from trainguard.rules import RuleSpec, RuleStatus
    from trainguard.rules.runner import RuleRunner

    # 600 ms per batch in collate: far above the rest of a step even on a busy machine (at 200 ms
    # a step under a load of ~10 waited for data 50-52 % of its time, at the rule's threshold)
    done = _run(tmp_path, "0.6", TRAINGUARD_PROFILER="1", TRAINGUARD_PROFILER_INTERVAL_MS="100")
    assert done.returncode == 0, done.stderr
    specs = [RuleSpec.parse("Dataloader"), RuleSpec.parse("CPUBottleneck")]
    statuses = RuleRunner(str(tmp_path / "run"), specs, wait_timeout=30).run()
    assert statuses["Dataloader"].status == RuleStatus.ISSUES_FOUND
    findings = json.loads((tmp_path / "run" / "rule-output" / "Dataloader.json").read_text())["findings"]
    assert any(finding["fired"] and "waiting for data" in finding["message"] for finding in findings)
    assert statuses["CPUBottleneck"].status == RuleStatus.NO_ISSUES_FOUND  # no GPU here: cannot fire


@pytest.mark.slow
def test_zero_code_without_the_variable_writes_no_profiler_output(tmp_path: Path) -> None:
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run").is_dir() and not (tmp_path / "run" / "profiler-output").exists()


@pytest.mark.slow
def test_bad_interval_in_environment_fails_open(tmp_path: Path) -> None:
    done = _run(tmp_path, TRAINGUARD_PROFILER="1", TRAINGUARD_PROFILER_INTERVAL_MS="10")
    assert done.returncode == 0 and "trained" in done.stdout
    assert "profiler not started" in done.stderr and "interval_ms=10" in done.stderr


def test_start_from_environment_reads_its_variables(tmp_path: Path) -> None:
    assert start_from_environment({"TRAINGUARD_OUT_DIR": str(tmp_path)}) is None
    profiler = start_from_environment(
        {"TRAINGUARD_PROFILER": "1", "TRAINGUARD_OUT_DIR": str(tmp_path), "TRAINGUARD_PROFILER_INTERVAL_MS": "200",
         "TRAINGUARD_PROFILER_FRAMEWORK": "0"}
    )  # fmt: skip
    assert profiler is not None
    try:
        assert profiler.interval_s == 0.2 and profiler.want_framework is False
        assert profiler.url == str(tmp_path / "profiler-output")
    finally:
        profiler.stop()
