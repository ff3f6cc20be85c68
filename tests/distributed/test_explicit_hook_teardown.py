"""A DDP job with an explicit ``Hook`` ends (issue 48 item 0), as the zero-code one does
(test_teardown.py).

The program is the detection corpus's 2-rank GPT-like job (bench/detection/others_ddp.py, as
minimal GPT scripts write it): the hook registers the model before it is wrapped in
``DistributedDataParallel``, saves every 5 steps, each rank closes its own hook *during* the
script (worker 0's end marker then waits for worker 1 on a thread of its own), and only then is the
process group destroyed, while the DDP model is still alive; the model dies at the worker's
return. The run must end with every rank past ``destroy_process_group``, the run's end marker
written after worker 1's end key, and no process of it (torchrun, ranks, writer processes)
left behind.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from bench.detection import others_ddp
from bench.detection.others_common import OthersSpec

pytestmark = pytest.mark.skipif(shutil.which("torchrun") is None, reason="needs torchrun")


def _processes_naming(path: str) -> list[str]:
    """Command lines of live processes with ``path`` among their arguments."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                arguments = file.read().split(b"\0")
        except OSError:
            continue
        if any(path.encode() in argument for argument in arguments):
            found.append(b" ".join(arguments).decode(errors="replace")[:200])
    return found


def test_a_gpt_ddp_job_with_an_explicit_hook_ends(tmp_path, monkeypatch):
    # A hang fails the test in minutes, not the corpus's 7 (the builder kills the job and records it)
    monkeypatch.setattr(others_ddp, "TIMEOUT_S", 240)
    run = os.fspath(tmp_path / "run")
    others_ddp.train_ddp_gpt(run, OthersSpec("ddp_gpt", lr=3e-3, steps=20, save_interval=5))

    metrics = json.loads((tmp_path / "run" / "corpus-metrics.json").read_text())
    assert "hang" not in metrics, metrics.get("hang")
    assert len(metrics["losses"]) == 20
    for rank in (0, 1):
        lines = (tmp_path / "run" / f"rank{rank}.log").read_text().splitlines()
        assert lines[-1].endswith("process group destroyed"), lines
    peer_end = tmp_path / "run" / "workers_ended" / "worker_1.ts"
    end = tmp_path / "run" / "training_job_end.ts"
    assert end.stat().st_mtime_ns >= peer_end.stat().st_mtime_ns
    assert _processes_naming(run) == []


def test_a_job_past_its_timeout_is_killed_with_every_process_it_started(tmp_path, monkeypatch):
    """torchrun starts each rank in a session of its own: the builder killing torchrun's process
    group alone left the ranks (and their writer processes) running after it gave up."""
    monkeypatch.setattr(others_ddp, "TIMEOUT_S", 25)
    run = os.fspath(tmp_path / "run")
    with pytest.raises(RuntimeError, match="did not finish"):  # killed before any loss was recorded
        others_ddp.train_ddp_gpt(run, OthersSpec("ddp_gpt", lr=3e-3, steps=1_000_000, save_interval=5))

    for rank in (0, 1):  # both ranks were training when the timeout came
        assert (tmp_path / "run" / f"rank{rank}.log").read_text().splitlines()[-1].endswith(" training")
    hang = json.loads((tmp_path / "run" / "corpus-metrics.json").read_text())["hang"]
    assert hang["timed_out"] and hang["dump"] == others_ddp.HANG_DUMP
    assert "others_ddp.py" in (tmp_path / "run" / others_ddp.HANG_DUMP).read_text()
    assert _processes_naming(run) == []
