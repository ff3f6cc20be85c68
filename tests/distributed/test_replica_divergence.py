"""ReplicaDivergence on real torchrun gloo CPU jobs under ``trainguard run --rules ReplicaDivergence
--stop-on-issue``: each fault of tests/distributed/_ddp_program.py is found with its ranks and first
step within 2 saved steps and stops the job; the healthy variants (gradient accumulation under
no_sync, BatchNorm, bf16 autocast) stay silent. Faults on one rank run on 4 ranks (a majority
names the odd one); faults on every rank on 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = Path(__file__).with_name("_ddp_program.py")
INTERVAL = 4
EXIT_STOPPED_BY_RULE = 3


def _train(tmp_path: Path, ranks: int, *program: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    run = tmp_path / "run"
    command = [
        sys.executable, "-m", "trainguard.cli", "run", "--out", str(run), "--save-interval", str(INTERVAL),
        "--rules", "ReplicaDivergence", "--stop-on-issue", "--",
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
        str(PROGRAM), "--steps", "30", "--sleep", "0.3", *program,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    return done, run


# fault, ranks, the faulty ranks named, the first step the fault shows in, words of the fix hint
FAULTS = [
    ("nudge", 4, [2], 7, "outside the all-reduced update"),
    ("skip_step", 4, [2], 9, "skipped an optimizer.step()"),
    ("outside", 2, [0, 1], 0, "outside the module DistributedDataParallel wraps"),
    ("no_sync", 2, [0, 1], 0, "no_sync() context is never left"),
    ("seeds", 2, [0, 1], 0, "seeded per rank, never broadcast"),
]


@pytest.mark.parametrize(("fault", "ranks", "named", "shows_at", "hint"), FAULTS, ids=[fault[0] for fault in FAULTS])
def test_a_divergence_is_found_by_rank_and_stops_the_job(
    tmp_path: Path, fault: str, ranks: int, named: list[int], shows_at: int, hint: str
) -> None:
    # the fault begins at step 7 on rank 2 (nudge, skip_step: its first skipped step is 9)
    done, run = _train(tmp_path, ranks, "--fault", fault, "--fault-rank", "2", "--fault-step", "7")
    assert done.returncode == EXIT_STOPPED_BY_RULE, done.stdout + done.stderr
    stop = json.loads((run / "trainguard-stop.json").read_text())
    assert stop["rule"] == "ReplicaDivergence" and stop["certain"], stop
    output = json.loads((run / "rule-output" / "ReplicaDivergence.json").read_text())
    first = output["findings"][0]
    details = first["details"]
    assert details["ranks"] == named, first["message"]
    # found within 2 saved steps of the first step the fault can show in
    assert shows_at <= details["first_step"] <= shows_at + 2 * INTERVAL, first["message"]
    assert hint in first["fix_hint"], first["fix_hint"]
    # the stop came from a second fingerprint that still differed, within 2 saved steps more
    trigger = (stop.get("triggered_by") or stop)["message"]
    confirmed_at = int(re.search(r"fingerprint of step (\d+)", trigger).group(1))
    assert details["first_step"] < confirmed_at <= details["first_step"] + 2 * INTERVAL, stop


def test_healthy_ddp_with_accumulation_batchnorm_and_bf16_stays_silent(tmp_path: Path) -> None:
    done, run = _train(tmp_path, 2, "--accumulate", "2", "--batchnorm", "--bf16")
    assert done.returncode == 0, done.stdout + done.stderr
    output = json.loads((run / "rule-output" / "ReplicaDivergence.json").read_text())
    assert output["status"] == "NoIssuesFound" and not output["findings"], output
    assert "training completed" in done.stdout


def _explicit_hook_run(tmp_path: Path, ranks: int, *program: str) -> list[dict]:
    """The program with its own ``Hook`` at smdebug's defaults (only rank 0 saves tensors), under
    plain torchrun; then ReplicaDivergence offline (``trainguard rules run``): its JSON lines."""
    run = tmp_path / "hook"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
        str(PROGRAM), "--steps", "24", "--hook-dir", str(run), "--hook-interval", str(INTERVAL), *program,
    ]  # fmt: skip
    trained = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert trained.returncode == 0 and "training completed" in trained.stdout, trained.stdout + trained.stderr
    judged = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "rules", "run", str(run), "--rule", "ReplicaDivergence", "--json"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    return [json.loads(line) for line in judged.stdout.splitlines() if line.startswith("{")]


def test_an_explicit_hook_at_its_defaults_fingerprints_every_rank(tmp_path: Path) -> None:
    # include_workers="one" saves no tensors on the other ranks, but their fingerprints still
    lines = _explicit_hook_run(tmp_path, 4, "--fault", "nudge", "--fault-rank", "2", "--fault-step", "7")
    results = [line["result"] for line in lines if line.get("result")]
    assert results and results[0]["details"]["ranks"] == [2], results[:1]
    assert results[0]["step"] == 8 and results[0]["details"]["first_step"] == 8, results[0]["message"]
    (primary,) = next(line["diagnosis"] for line in lines if "diagnosis" in line)["primary"]
    assert primary["rule"] == "ReplicaDivergence" and primary["certain"] and primary["certain_from"] == 12, primary


def test_an_explicit_hook_on_a_healthy_ddp_job_is_judged_and_silent(tmp_path: Path) -> None:
    lines = _explicit_hook_run(tmp_path, 2, "--batchnorm")
    final = [line for line in lines if line.get("status") and not line.get("result")][-1]
    assert final["status"] == "NoIssuesFound" and final["last_evaluated_step"] == 20, final
