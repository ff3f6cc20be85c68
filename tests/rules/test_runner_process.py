"""The runner as a process (``python -m trainguard.rules``): killed mid-run and restarted
with its progress file, it neither misses nor repeats steps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tests.rules.synthetic import write_run
from tests.rules.test_runner import HERE, _values

REPO = Path(__file__).resolve().parents[2]
STEPS = 40


def _start(run: str, log: Path, progress: Path, delay: float) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "trainguard.rules", run, "--rule",
         f"{HERE}:ValueAbove:log={log},delay={delay}", "--progress", str(progress),
         "--json", "--poll-interval", "0.05"],
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _checks(log: Path) -> list[int]:
    return (
        [int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith("check")]
        if log.exists()
        else []
    )


def _kill_mid_run(tmp_path: Path, signum: int) -> tuple[list[int], dict, Path]:
    run = write_run(tmp_path / "run", _values({5, 30}, range(STEPS)))
    log, progress = tmp_path / "log", tmp_path / "progress.json"
    first = _start(run, log, progress, delay=0.05)
    deadline = time.monotonic() + 60
    while len(_checks(log)) < 12 and time.monotonic() < deadline:
        time.sleep(0.02)
    first.send_signal(signum)
    first.wait(timeout=30)
    killed_at = len(_checks(log))
    assert 12 <= killed_at < STEPS, "the runner was stopped in the middle of the run"
    second = _start(run, log, progress, delay=0.0)
    out, err = second.communicate(timeout=120)
    assert second.returncode == 1, err  # issues found
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    # --json ends with the run's diagnosis; the status updates come before it
    diagnosis = lines[-1]["diagnosis"]
    assert [(f["rule"], f["step"]) for f in diagnosis["primary"]] == [("ValueAbove", 5)]
    final = lines[-2]
    return _checks(log), final, Path(run)


def test_sigkill_mid_run_then_restart_misses_no_step(tmp_path: Path) -> None:
    checks, final, run = _kill_mid_run(tmp_path, signal.SIGKILL)
    counts = Counter(checks)
    assert sorted(counts) == list(range(STEPS)), "no step is missed"
    repeated = [step for step, count in counts.items() if count > 1]
    # SIGKILL can land between a step's evaluation and the save of its progress: only the
    # steps of that instant are evaluated again (progress is saved at least every 50 ms).
    assert len(repeated) <= 2 and all(counts[step] == 2 for step in repeated)
    assert final["status"] == "IssuesFound" and "at step 5 resulted" in final["status_details"]
    document = json.loads((run / "rule-output" / f"{HERE}:ValueAbove.json").read_text())
    assert [f["step"] for f in document["findings"]] == [5, 30], "no finding is recorded twice"


def test_sigterm_mid_run_then_restart_evaluates_each_step_once(tmp_path: Path) -> None:
    checks, final, run = _kill_mid_run(tmp_path, signal.SIGTERM)
    assert checks == list(range(STEPS))
    assert final["status"] == "IssuesFound"
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["rules"][f"{HERE}:ValueAbove"]["last_evaluated_step"] == STEPS - 1
    assert [f["step"] for f in progress["rules"][f"{HERE}:ValueAbove"]["findings"]] == [5, 30]
