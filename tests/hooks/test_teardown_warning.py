"""``trainguard run`` names the processes of a training command that outlives its capture's end.

Seen in CI: a DDP script's rank deadlocked in PyTorch's teardown (~ProcessGroupGloo joining its
gloo threads while holding the GIL) after training, and ``trainguard run`` waited without a word
until the test's timeout. The supervisor now warns once, naming the processes, when the command
is still running TRAINGUARD_TEARDOWN_WARNING_SECONDS after the end-of-training marker; it stops
nothing. Here a script hangs after the hook's close on purpose (an atexit handler registered
before ``import torch`` runs after the hook's own).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from trainguard.trials import create_trial

HANGS_IN_TEARDOWN = """
import atexit, os, sys, time
atexit.register(time.sleep, float(sys.argv[1]))  # runs after the hook's close: registered first
import torch
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    optimizer.zero_grad()
    model(torch.randn(4, 2)).pow(2).mean().backward()
    optimizer.step()
print(f"script pid {os.getpid()}", flush=True)
"""


def _run(tmp_path, hang_seconds: float, warn_seconds: str, timeout: float = 120):
    script = tmp_path / "hangs.py"
    script.write_text(HANGS_IN_TEARDOWN)
    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "trainguard.cli", "run", "--out", str(out), "--save-interval", "1", "--",
        sys.executable, str(script), str(hang_seconds),
    ]  # fmt: skip
    environment = {**os.environ, "TRAINGUARD_TEARDOWN_WARNING_SECONDS": warn_seconds}
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment)
    return out, result


def test_command_alive_after_the_end_marker_is_named_not_stopped(tmp_path):
    out, result = _run(tmp_path, hang_seconds=8, warn_seconds="1")
    assert result.returncode == 0, result.stderr[-3000:]  # waited for it: nothing was killed
    pid = int(re.search(r"^script pid (\d+)$", result.stdout, re.M).group(1))
    warnings = [line for line in result.stderr.splitlines() if "still running" in line]
    assert len(warnings) == 1, result.stderr[-3000:]
    assert f"pid {pid} (" in warnings[0] and "hangs.py" in warnings[0], warnings[0]
    assert create_trial(out, collection_wait_timeout=0).training_ended


@pytest.mark.parametrize("value", ["0", "nan", "soon"])
def test_bad_warning_delay_fails_before_the_script_starts(tmp_path, value):
    out, result = _run(tmp_path, hang_seconds=0, warn_seconds=value, timeout=60)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "TRAINGUARD_TEARDOWN_WARNING_SECONDS" in result.stderr, result.stderr
    assert "script pid" not in result.stdout
