"""Rules evaluate every worker: a real 2-rank gloo DDP job with a fault planted on rank 1 only."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainguard.rules import RuleSpec, RuleStatus
from trainguard.rules.runner import RuleRunner
from trainguard.trial import create_trial

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_ddp_fault_worker.py")
FAULT_FROM_STEP = 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("ddp") / "run"
    port = _free_port()
    processes = []
    for rank in range(2):
        environment = {
            **os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }  # fmt: skip
        processes.append(
            subprocess.Popen([sys.executable, str(WORKER), str(out)], env=environment,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        )
    try:
        outputs = [process.communicate(timeout=180) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    for rank, (process, (_, stderr)) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, f"rank {rank} failed:\n{stderr[-3000:]}"
    return str(out)


def test_the_fault_is_on_rank_1_only(ddp_run: str) -> None:
    """The oracle: worker_1's loss is -inf from the fault step on, worker_0's data is all finite."""
    trial = create_trial(ddp_run, collection_wait_timeout=0)
    assert trial.workers() == ["worker_0", "worker_1"]
    (loss_name,) = trial.tensor_names(collection="losses")
    loss = trial.tensor(loss_name)
    for step in trial.steps():
        assert np.isfinite(loss.value(step, worker="worker_0")).all()
        assert np.isfinite(loss.value(step, worker="worker_1")).all() == (step < FAULT_FROM_STEP)
    for name in trial.tensor_names():
        for step in trial.tensor(name).steps():
            assert np.isfinite(trial.tensor(name).value(step, worker="worker_0")).all(), (name, step)


def test_a_fault_on_rank_1_is_found_and_attributed_to_worker_1(ddp_run: str, tmp_path: Path) -> None:
    final = RuleRunner(ddp_run, [RuleSpec("ExplodingTensor")], output_dir=str(tmp_path)).run()
    assert final["ExplodingTensor"].status == RuleStatus.ISSUES_FOUND
    document = json.loads((tmp_path / "rule-output" / "ExplodingTensor.json").read_text())
    findings = document["findings"]
    assert findings and {f["worker"] for f in findings} == {"worker_1"}, findings
    assert min(f["step"] for f in findings) == FAULT_FROM_STEP
    primary = document["diagnosis"]["primary"][0]
    assert (primary["rule"], primary["step"], primary["worker"]) == ("ExplodingTensor", FAULT_FROM_STEP, "worker_1")
    assert document["diagnosis"]["this_rule"] == "primary"


def test_rules_run_names_the_worker(ddp_run: str, tmp_path: Path) -> None:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "trainguard.cli", "rules", "run", ddp_run, "--rule", "ExplodingTensor",
               "--output-dir", str(tmp_path), "--json"]  # fmt: skip
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    diagnosis = lines[-1]["diagnosis"]
    assert [(f["rule"], f["worker"]) for f in diagnosis["primary"]] == [("ExplodingTensor", "worker_1")]
    fired = [line["result"] for line in lines[:-1] if line.get("result") and line["result"]["fired"]]
    assert fired and all(result["worker"] == "worker_1" for result in fired)
