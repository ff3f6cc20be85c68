"""Real 2-process gloo jobs on CPU: which workers write, what the trial sees, completeness."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.hooks._util import REPO, ZERO_CODE_EXAMPLES
from trainguard.format.layout import END_OF_TRAINING, index_key
from trainguard.modes import ModeKeys
from trainguard.trials import StepState, create_trial

WORKER = Path(__file__).with_name("_ddp_worker.py")
STEPS = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_job(tmp_path: Path, include_workers: str, world_size: int = 2, others: str | None = None,
            extra_env: dict[str, str] | None = None):  # fmt: skip
    """Start ``world_size`` ranks of _ddp_worker.py; return (run dir, per-rank expectations)."""
    out = tmp_path / "run"
    port = free_port()
    processes = []
    for rank in range(world_size):
        environment = {
            **os.environ,
            "RANK": str(rank), "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            **(extra_env or {}),
        }  # fmt: skip
        command = [sys.executable, str(WORKER), str(out), include_workers, str(tmp_path / f"expected_{rank}.pt")]
        if others is not None:
            command.append(others)
        processes.append(
            subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=120))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    for rank, (process, (_stdout, stderr)) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, f"rank {rank} failed:\n{stderr[-3000:]}"
        assert "capture disabled" not in stderr, stderr[-3000:]
    expected = [torch.load(tmp_path / f"expected_{rank}.pt") for rank in range(world_size)]
    return out, expected


@pytest.mark.slow
def test_include_workers_all(tmp_path):
    out, expected = run_job(tmp_path, "all")
    trial = create_trial(out)
    assert trial.workers() == ["worker_0", "worker_1"]
    assert trial.num_workers == 2
    assert trial.steps() == list(range(STEPS))
    assert sorted(path.name for path in (out / "collections" / "000000000").iterdir()) == [
        "worker_0_collections.json", "worker_1_collections.json",
    ]  # fmt: skip
    weight, gradient, loss = (
        trial.tensor(name) for name in ("Net_fc1.weight", "gradient/Net_fc1.weight", "MSELoss_output_0")
    )
    for step in range(STEPS):
        assert weight.workers(step) == ["worker_0", "worker_1"]
        assert gradient.workers(step) == ["worker_0", "worker_1"]
        for rank in (0, 1):
            worker = f"worker_{rank}"
            used = expected[rank][step]
            np.testing.assert_array_equal(weight.value(step, worker=worker), used["weight"].numpy())
            assert float(loss.value(step, worker=worker)) == used["loss"]
            # the gradient the optimizer applied: DDP's all-reduced average, the same on both ranks
            np.testing.assert_array_equal(gradient.value(step, worker=worker), used["grad"].numpy())
        # each rank saw its own data
        assert expected[0][step]["loss"] != expected[1][step]["loss"]


@pytest.mark.slow
def test_steps_are_complete_only_when_every_worker_wrote(tmp_path):
    out, _ = run_job(tmp_path, "all")
    # What a reader of the live run saw before worker_1 wrote its last step: no end marker, and
    # worker_1's index of the last step missing.
    live = tmp_path / "live"
    shutil.copytree(out, live)
    (live / END_OF_TRAINING).unlink()
    (live / index_key(STEPS - 1, "worker_1")).unlink()
    trial = create_trial(live, collection_wait_timeout=0)
    assert trial.num_workers == 2
    assert trial.steps() == list(range(STEPS - 1))
    assert trial.steps(show_incomplete_steps=True) == list(range(STEPS))
    assert trial.has_passed_step(STEPS - 2) == StepState.AVAILABLE
    assert trial.has_passed_step(STEPS - 1) == StepState.NOT_YET_AVAILABLE
    assert trial.last_complete_step == STEPS - 2
    # the missing index arrives: the step completes
    shutil.copy(out / index_key(STEPS - 1, "worker_1"), live / index_key(STEPS - 1, "worker_1"))
    trial.refresh(force=True)
    assert trial.steps() == list(range(STEPS))
    assert trial.has_passed_step(STEPS - 1) == StepState.AVAILABLE


@pytest.mark.slow
@pytest.mark.parametrize(("include_workers", "close"), [("all", "explicit"), ("all", "at_exit"), ("one", "at_exit")])
def test_the_end_marker_waits_for_a_late_rank(tmp_path, include_workers, close):
    """Rank 1 ends its capture 2 s after rank 0: the end marker, which readers and uploaders take
    for "nothing more comes", must come after rank 1's last step, not at rank 0's close."""
    out = tmp_path / "run"
    seen_at_end: list[bool] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if (out / END_OF_TRAINING).exists():
                seen_at_end.append((out / index_key(STEPS - 1, "worker_1")).exists())
                return
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    extra = {"TG_TEST_LATE_RANK": "1", "TG_TEST_CLOSE_AT_EXIT": "1" if close == "at_exit" else "0"}
    try:
        run_job(tmp_path, include_workers, extra_env=extra)
    finally:
        stop.set()
        watcher.join(5)
    assert seen_at_end == [True], "the end marker came before worker_1's last step"
    assert sorted(p.name for p in (out / "workers_ended").iterdir()) == ["worker_0.ts", "worker_1.ts"]
    trial = create_trial(out)
    assert trial.training_ended and trial.steps() == list(range(STEPS))
    # under "one" rank 1 writes its losses only
    name = "Net_fc1.weight" if include_workers == "all" else "MSELoss_output_0"
    assert trial.tensor(name).workers(STEPS - 1) == ["worker_0", "worker_1"]


@pytest.mark.slow
def test_include_workers_one_saves_every_ranks_losses_and_rank_0s_tensors(tmp_path):
    out, expected = run_job(tmp_path, "one")
    trial = create_trial(out)
    # rank 1 writes its own losses (rank-local: a non-finite loss there must be seen), nothing else
    assert trial.workers() == ["worker_0", "worker_1"]
    assert trial.num_workers == 1  # completeness waits for rank 0 only
    assert trial.steps() == list(range(STEPS))
    assert sorted(path.name for path in (out / "collections" / "000000000").iterdir()) == [
        "worker_0_collections.json", "worker_1_collections.json",
    ]  # fmt: skip
    loss = trial.tensor("MSELoss_output_0")
    for step in range(STEPS):
        assert trial.tensor("Net_fc1.weight").workers(step) == ["worker_0"]
        assert trial.tensor("gradient/Net_fc1.weight").workers(step) == ["worker_0"]
        np.testing.assert_array_equal(
            trial.tensor("gradient/Net_fc1.weight").value(step), expected[0][step]["grad"].numpy()
        )
        assert loss.workers(step) == ["worker_0", "worker_1"]
        for rank in (0, 1):
            assert float(loss.value(step, worker=f"worker_{rank}")) == expected[rank][step]["loss"]
    rank_1_files = [path for path in out.rglob("*worker_1*") if path.suffix == ".tfevents"]
    assert rank_1_files and sum(path.stat().st_size for path in rank_1_files) < 4096  # a few scalars
    assert trial.training_ended


@pytest.mark.slow
def test_include_workers_one_without_other_workers_collections_writes_rank_0_only(tmp_path):
    out, expected = run_job(tmp_path, "one", others="none")
    trial = create_trial(out)
    assert trial.workers() == ["worker_0"]
    assert trial.num_workers == 1
    assert trial.steps() == list(range(STEPS))
    assert not any("worker_1" in path.name for path in out.rglob("*"))
    for step in range(STEPS):
        assert trial.tensor("Net_fc1.weight").workers(step) == ["worker_0"]
        np.testing.assert_array_equal(
            trial.tensor("gradient/Net_fc1.weight").value(step), expected[0][step]["grad"].numpy()
        )
    assert trial.training_ended


def _run_to_the_end(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``trainguard run`` ``command``; past ``timeout`` the test fails with trainguard's stderr and
    stops the training processes instead of leaving them behind.

    A rank can deadlock in PyTorch's own DDP teardown after training (seen in CI: its main thread
    in ~ProcessGroupGloo, joining a gloo thread while holding the GIL; that thread waits for the
    GIL to free the contextvars.Context that backward stashed in an allreduce's thread-local
    state). trainguard names such processes 30 s after the end marker; SIGTERM to trainguard
    reaches the script's whole process group.
    """
    environment = {**os.environ, "TRAINGUARD_TEARDOWN_WARNING_SECONDS": "30"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.terminate()  # forwarded to the script's process group
        try:
            stdout, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        pytest.fail(f"trainguard run still running after {timeout:.0f} s; its stderr: {stderr[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.mark.slow
@pytest.mark.parametrize("include_workers", ["all", "one"])
def test_zero_code_ddp_script_that_spawns_its_ranks(tmp_path, include_workers):
    config = tmp_path / "hook.json"
    config.write_text(json.dumps({"HookParameters": {"include_workers": include_workers, "save_interval": "1"}}))
    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "trainguard.cli", "run", "--out", str(out), "--config", str(config), "--",
        sys.executable, str(ZERO_CODE_EXAMPLES / "ddp_spawn.py"), "--steps", "3",
    ]  # fmt: skip
    result = _run_to_the_end(command, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "capture disabled" not in result.stderr, result.stderr[-3000:]
    trial = create_trial(out)
    # "one": rank 1 saves its losses only; "all": everything
    workers = ["worker_0", "worker_1"]
    tensor_workers = workers if include_workers == "all" else ["worker_0"]
    assert trial.workers() == workers
    assert trial.num_workers == len(tensor_workers)
    assert trial.steps(ModeKeys.TRAIN) == [0, 1, 2]  # one step per optimizer step on every rank
    assert trial.training_ended
    # the ranks print to one pipe: parse by pattern, not by line
    pattern = r"rank (\d+) train_loss (\d+) (-?0x[0-9a-f]+\.?[0-9a-f]*p[+-]\d+)"
    printed = {(int(r), int(s)): float.fromhex(h) for r, s, h in re.findall(pattern, result.stdout)}
    assert len(printed) == 2 * 3, result.stdout
    # DDP is the root module the script calls
    loss = trial.tensor("MSELoss_output_0")
    gradient = trial.tensor("gradient/DistributedDataParallel_module.fc1.weight")
    for step in range(3):
        assert loss.workers(step) == workers
        assert gradient.workers(step) == tensor_workers
        for rank, worker in enumerate(workers):
            assert float(loss.value(step, worker=worker)) == printed[(rank, step)]
        if include_workers == "all":
            # all-reduced gradients: identical on both ranks although their data differ
            np.testing.assert_array_equal(
                gradient.value(step, worker="worker_0"), gradient.value(step, worker="worker_1")
            )
    assert f"workers {', '.join(workers)}" in result.stdout
