"""A writer process started as the hook is created (writer/spawn.py): the first save adopts
it and names its worker; a hook that never saves, a forked copy, a thread writer, a process too
old or for another directory never leave one running, nor shared memory behind."""

from __future__ import annotations

import multiprocessing
import os
import time

import numpy as np
import pytest
import torch

import trainguard.pytorch as tg
from trainguard.modes import ModeKeys
from trainguard.storage import open_store
from trainguard.trials import create_trial
from trainguard.writer.opening import open_step_writer, start_ahead
from trainguard.writer.process import ProcessStepWriter
from trainguard.writer.spawn import WriterChild, in_multiprocessing_child, shared_memory_dir
from trainguard.writer.thread import StepWriter


def _rings() -> set[str]:
    return {name for name in os.listdir(shared_memory_dir()) if name.startswith("trainguard-ring-")}


def _ended(process, seconds: float = 10.0) -> bool:
    try:
        process.wait(timeout=seconds)
    except Exception:  # noqa: BLE001 - still running
        return False
    return True


def _train(hook: tg.Hook, steps: int = 5) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    hook.register_module(model)
    loss_fn = torch.nn.MSELoss()
    hook.register_loss(loss_fn)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        loss_fn(model(torch.randn(3, 4)), torch.randn(3, 2)).backward()
        optimizer.step()
    return model


def test_the_first_save_adopts_the_process_started_with_the_hook(tmp_path):
    before = _rings()
    hook = tg.Hook(out_dir=str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=2), writer="auto")
    started = hook._started_writer
    assert started is not None and started.process.poll() is None
    pid = started.process.pid
    model = _train(hook)
    assert type(hook._writer) is ProcessStepWriter and hook._writer.pid == pid  # no second process
    assert hook._started_writer is None
    hook.close()
    assert _ended(started.process, 0)  # close waited for it
    trial = create_trial(str(tmp_path / "run"), collection_wait_timeout=0)
    assert trial.steps() == [0, 2, 4]
    weights = sorted(trial.tensor(name).value(4).shape for name in trial.tensor_names(collection="weights"))
    assert weights == sorted(tuple(layer.weight.shape) for layer in (model[0], model[2]))
    assert _rings() <= before


def test_a_hook_that_never_saves_stops_its_process_at_close(tmp_path):
    before = _rings()
    hook = tg.Hook(out_dir=str(tmp_path / "run"), writer="process")
    process = hook._started_writer.process
    hook.close()
    assert _ended(process, 0) and process.returncode == 0
    assert _rings() <= before


def test_an_unnamed_process_exits_by_itself_and_is_not_adopted_then(tmp_path, monkeypatch):
    monkeypatch.setattr(WriterChild, "idle_seconds", 1.0)
    before = _rings()
    store = open_store(tmp_path / "run")
    child = start_ahead(store, "auto", 256 << 20)
    assert child is not None
    assert _ended(child.process, 10) and child.process.returncode == 0
    assert not child.adoptable(os.fspath(store.root), child.ring_size)
    writer = open_step_writer(store, "worker_0", kind="auto", started=child)  # starts a new one
    assert type(writer) is ProcessStepWriter and writer.pid != child.process.pid
    _write_and_check(writer, tmp_path / "run")
    assert _rings() <= before


def _write_and_check(writer, run) -> None:
    for step in range(3):
        writer.begin_step(step, ModeKeys.TRAIN, step)
        writer.add_tensor("x", np.full(1000, step, dtype=np.float32), nbytes=4000)
        writer.end_step()
    writer.write_object("collections/000000000/worker_0_collections.json", b'{"collections": {}}')
    assert writer.close(30) and writer.failure is None
    trial = create_trial(str(run), collection_wait_timeout=0)
    for step in range(3):
        np.testing.assert_array_equal(trial.tensor("x").value(step), np.full(1000, step, dtype=np.float32))


@pytest.mark.parametrize("mismatch", ["root", "ring"])
def test_a_process_started_for_another_writer_is_stopped_and_replaced(tmp_path, mismatch):
    before = _rings()
    other = tmp_path / "other" if mismatch == "root" else tmp_path / "run"
    child = start_ahead(open_store(other), "auto", (256 << 20) if mismatch == "root" else 2 << 20)
    writer = ProcessStepWriter(open_store(tmp_path / "run"), "worker_0", started=child)
    assert writer.pid != child.process.pid and _ended(child.process, 0)
    _write_and_check(writer, tmp_path / "run")
    assert not (tmp_path / "other" / "events").exists()
    assert _rings() <= before


def test_a_thread_writer_stops_the_process_started_ahead(tmp_path):
    store = open_store(tmp_path / "run")
    child = start_ahead(store, "auto", 256 << 20)
    writer = open_step_writer(store, "worker_0", kind="thread", started=child)
    assert type(writer) is StepWriter and _ended(child.process, 0)
    writer.close()
    assert start_ahead(store, "thread", 256 << 20) is None
    assert start_ahead(open_store("memory://ahead"), "auto", 256 << 20) is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_before_the_first_save_leaves_the_parents_process_alone(tmp_path):
    """A DataLoader worker forked before the first save: its copy closes its end of the pipe
    (the writer process must see end-of-file when training ends) and never stops the process."""
    store = open_store(tmp_path / "run")
    child = start_ahead(store, "auto", 256 << 20)
    pid = os.fork()
    if pid == 0:
        child.discard()  # what the worker's hook does at its close
        os._exit(0 if child.pipe < 0 else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child.process.poll() is None
    writer = ProcessStepWriter(store, "worker_0", started=child)
    assert writer.pid == child.process.pid
    _write_and_check(writer, tmp_path / "run")


def _report(queue) -> None:
    queue.put(in_multiprocessing_child())


def test_spawned_multiprocessing_children_start_nothing_ahead():
    assert not in_multiprocessing_child()
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_report, args=(queue,))
    process.start()
    try:
        assert queue.get(timeout=60) is True
    finally:
        process.join(30)


def test_a_dry_run_starts_nothing(tmp_path):
    hook = tg.Hook(out_dir=str(tmp_path / "run"), dry_run=True)
    assert hook._started_writer is None
    hook.close()


def test_the_started_process_is_named_before_its_first_step(tmp_path):
    """Its files carry the worker name the first save gives it, here a rank's."""
    store = open_store(tmp_path / "run")
    child = start_ahead(store, "auto", 256 << 20)
    time.sleep(0.5)  # let it start: the name must reach a running process, too
    writer = ProcessStepWriter(store, "worker_3", started=child)
    writer.begin_step(0, ModeKeys.TRAIN, 0)
    writer.add_tensor("x", np.ones(4, dtype=np.float32), nbytes=16)
    writer.end_step()
    assert writer.close(30) and writer.failure is None
    assert os.listdir(tmp_path / "run" / "index" / "000000000") == ["000000000000_worker_3.json"]


def test_a_process_that_cannot_start_ahead_starts_at_the_first_save(tmp_path, monkeypatch):
    """Fail open: no shared memory (say) as the hook is created costs nothing but the head start."""
    import trainguard.writer.opening as writer_opening

    real = writer_opening.WriterChild

    def unavailable(root, ring_size, nice, worker):
        if worker is None:
            raise OSError(28, "No space left on device")
        return real(root, ring_size, nice, worker)

    monkeypatch.setattr(writer_opening, "WriterChild", unavailable)  # start_ahead's
    hook = tg.Hook(out_dir=str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=2), writer="process")
    assert hook._started_writer is None
    _train(hook)
    assert type(hook._writer) is ProcessStepWriter
    hook.close()
    assert create_trial(str(tmp_path / "run"), collection_wait_timeout=0).steps() == [0, 2, 4]
