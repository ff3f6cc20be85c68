"""Fail open: the hook never changes training, an internal or disk error disables capture with
one log line, bad configuration fails before training, memory stays bounded, forks don't write."""

from __future__ import annotations

import builtins
import errno
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.optim.optimizer as torch_optimizer
from torch.utils.data import DataLoader, Dataset

import trainguard.hooks.pytorch as hooks_pytorch
import trainguard.hooks.torch_saving as hooks_torch_saving
import trainguard.pytorch as tg
import trainguard.storage.local as storage_local
import trainguard.writer.opening as hooks_writer_opening
import trainguard.writer.step_file as hooks_step_file
import trainguard.writer.thread as hooks_writer
from tests.hooks._util import as_numpy
from trainguard.errors import ConfigError
from trainguard.format.layout import END_OF_TRAINING
from trainguard.hooks.zero_code import ZeroCodeHook
from trainguard.trials import create_trial

STEPS = 8


class DropoutNet(nn.Module):
    """Dropout makes the comparison meaningful: a hook that consumed RNG would change the losses."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def seeded_training(hook_factory=None, steps: int = STEPS, on_step=None):
    """Seeded training; returns (losses, final parameters, hook)."""
    torch.manual_seed(1234)
    model = DropoutNet()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    hook = None
    if hook_factory is not None:
        hook = hook_factory()
        hook.register_module(model)
        hook.register_loss(criterion)
    generator = torch.Generator().manual_seed(99)
    losses = []
    for step in range(steps):
        if on_step is not None:
            on_step(step)
        x = torch.randn(32, 6, generator=generator)
        y = torch.randint(0, 3, (32,), generator=generator)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().clone())
    if hook is not None:
        hook.close()
    return losses, [parameter.detach().clone() for parameter in model.parameters()], hook


@pytest.fixture(scope="module")
def reference():
    """The same training without any hook."""
    return seeded_training()


def assert_bit_identical(run, reference):
    losses, parameters, _ = run
    ref_losses, ref_parameters, _ = reference
    assert len(losses) == len(ref_losses)
    for step, (loss, ref) in enumerate(zip(losses, ref_losses, strict=True)):
        assert torch.equal(loss, ref), f"loss differs at step {step}: {loss.item()!r} != {ref.item()!r}"
    for parameter, ref in zip(parameters, ref_parameters, strict=True):
        assert torch.equal(parameter, ref)


def trainguard_warnings(caplog):
    return [record for record in caplog.records if record.name == "trainguard" and record.levelno >= logging.WARNING]


# -- (a) the hook changes nothing -------------------------------------------------------------
def test_losses_bit_identical_with_save_all_every_step(run_dir, reference):
    def factory():
        return tg.Hook(out_dir=str(run_dir), save_all=True, save_config=tg.SaveConfig(save_interval=1))

    run = seeded_training(factory)
    assert_bit_identical(run, reference)
    trial = create_trial(run_dir)
    assert trial.steps() == list(range(STEPS))
    # save_all really saved everything: inputs, outputs, dropout output, loss inputs, gradients
    names = set(trial.tensor_names())
    assert {
        "DropoutNet_input_0",
        "drop_output_0",
        "CrossEntropyLoss_input_1",
        "gradient/DropoutNet_fc1.weight",
    } <= names
    saved_losses = [float(trial.tensor("CrossEntropyLoss_output_0").value(step)) for step in range(STEPS)]
    assert saved_losses == [loss.item() for loss in reference[0]]


# -- (b) an internal error disables capture, training goes on --------------------------------
def _raise(*args, **kwargs):
    raise RuntimeError("injected failure")


INJECTIONS = {
    # training thread, in the forward pre-hook (weights at step begin)
    "snapshot": lambda mp, hook: mp.setattr(hooks_torch_saving, "snapshot", _raise),
    # inside autograd's backward: the post-accumulate-grad hook
    "gradient_hold": lambda mp, hook: mp.setattr(hooks_pytorch.TorchHook, "hold_torch_tensor", _raise),
    # the writer thread: opening the event file
    "open_writer": lambda mp, hook: mp.setattr(hook.store, "open_writer", _raise),
    # the writer thread: encoding a tensor
    "encode": lambda mp, hook: mp.setattr(hooks_step_file, "encode_tensor_event", _raise),
}


# Injections into the writer thread's own code: the writer process has its tests of the same
# faults (tests/hooks/test_writer_process.py: it fails, dies, stalls; a real full disk below).
THREAD_WRITER_INJECTIONS = ("open_writer", "encode")


def _pin_thread_writer(monkeypatch) -> None:
    monkeypatch.setenv("TRAINGUARD_WRITER", "thread")


@pytest.mark.parametrize("where", sorted(INJECTIONS))
@pytest.mark.parametrize("first_failing_step", [0, 3])
def test_internal_error_disables_capture_once(run_dir, reference, caplog, monkeypatch, where, first_failing_step):
    caplog.set_level(logging.DEBUG, logger="trainguard")
    if where in THREAD_WRITER_INJECTIONS:
        _pin_thread_writer(monkeypatch)
    hooks = []

    def factory():
        hook = tg.Hook(out_dir=str(run_dir), save_all=True, save_config=tg.SaveConfig(save_interval=1))
        hooks.append(hook)
        return hook

    def on_step(step):
        if step == first_failing_step:
            # optimizer.step() leaves its step open until the next forward (so a save_scalar
            # after it still lands there): end it now, so that the steps before are on disk.
            hooks[0].end_step()
            if hooks[0]._writer is not None:
                hooks[0]._writer.flush(10)  # the steps before are on disk, whole
            INJECTIONS[where](monkeypatch, hooks[0])

    run = seeded_training(factory, on_step=on_step)
    assert_bit_identical(run, reference)
    hook = hooks[0]
    assert hook.enabled is False
    warnings = trainguard_warnings(caplog)
    assert len(warnings) == 1, [record.getMessage() for record in warnings]
    message = warnings[0].getMessage()
    assert "capture disabled" in message and "injected failure" in message and "training continues" in message
    monkeypatch.undo()
    assert not list(run_dir.rglob(".*.tmp")), "the step open when capture was disabled left its temp file"
    # the steps before the failure are intact and readable
    if first_failing_step:
        trial = create_trial(run_dir, collection_wait_timeout=0)
        assert trial.steps() == list(range(first_failing_step))
        for step in trial.steps():
            trial.tensor("DropoutNet_fc1.weight").value(step)
            trial.tensor("gradient/DropoutNet_fc1.weight").value(step)
        if where in ("snapshot", "gradient_hold"):  # the writer survived: it says why the run is short
            stopped = trial.capture_stopped()
            assert list(stopped) == ["worker_0"]
            assert stopped["worker_0"]["step"] == first_failing_step
            assert "injected failure" in stopped["worker_0"]["reason"]
            from trainguard.summary import describe_run, render_summary

            summary = render_summary(describe_run(trial))
            assert f"worker_0 captured nothing from step {first_failing_step} on" in summary
            assert "RuntimeError: injected failure" in summary


def test_error_in_close_is_logged_not_raised(run_dir, caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="trainguard")
    losses, _, hook = seeded_training(
        lambda: tg.Hook(out_dir=str(run_dir), save_config=tg.SaveConfig(save_interval=1)), steps=2
    )
    assert len(losses) == 2 and not trainguard_warnings(caplog)
    hook2 = tg.Hook(out_dir=str(run_dir.parent / "second"))
    hook2._writer = object()  # a broken writer: close must swallow the error
    hook2.close()
    assert len(trainguard_warnings(caplog)) == 1


# -- (c) disk full / permission denied during training ----------------------------------------
class _FullDiskFile:
    """A real file whose writes fail as on a full disk."""

    def __init__(self, file):
        self._file = file

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self._file, name)


def _permissions_enforced(tmp: Path) -> bool:
    """False for root (or CAP_DAC_OVERRIDE), where a read-only directory still takes writes."""
    probe = tmp / "probe_dir"
    probe.mkdir()
    probe.chmod(0o555)
    try:
        (probe / "file").write_text("")
    except PermissionError:
        return True
    finally:
        probe.chmod(0o755)
    return False


def _make_disk_fail(monkeypatch, run_dir: Path) -> str:
    """From now on writes under run_dir fail. Returns what the log line must mention."""
    if _permissions_enforced(run_dir.parent):
        for directory in [run_dir, *[p for p in run_dir.rglob("*") if p.is_dir()]]:
            directory.chmod(0o555)
        return "permission denied"
    # root ignores permissions: simulate ENOSPC at the lowest level the local store uses
    real_open = builtins.open

    def failing_open(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        return _FullDiskFile(handle) if "w" in mode else handle

    monkeypatch.setattr(storage_local, "open", failing_open, raising=False)
    return "disk is full"


@pytest.mark.parametrize("fail_at_step", [0, 4])
def test_disk_failure_during_training_disables_capture(run_dir, reference, caplog, monkeypatch, fail_at_step):
    caplog.set_level(logging.WARNING, logger="trainguard")
    _pin_thread_writer(monkeypatch)  # the failure is injected in this process (as root, no chmod)
    hooks = []
    reason = []

    def factory():
        hooks.append(tg.Hook(out_dir=str(run_dir), save_all=True, save_config=tg.SaveConfig(save_interval=1)))
        return hooks[0]

    def on_step(step):
        if step == fail_at_step:
            hooks[0].end_step()  # the step optimizer.step() left open goes to disk before the failure
            if hooks[0]._writer is not None:
                hooks[0]._writer.flush(10)
            reason.append(_make_disk_fail(monkeypatch, run_dir))

    try:
        run = seeded_training(factory, on_step=on_step)
    finally:
        for directory in [run_dir, *[p for p in run_dir.rglob("*") if p.is_dir()]]:
            directory.chmod(0o755)
        monkeypatch.undo()
    assert_bit_identical(run, reference)
    assert hooks[0].enabled is False
    warnings = trainguard_warnings(caplog)
    assert len(warnings) == 1, [record.getMessage() for record in warnings]
    assert reason[0] in warnings[0].getMessage()
    assert not list(run_dir.rglob(".*.tmp")), "a failed write left its temp file behind"
    if fail_at_step:
        trial = create_trial(run_dir, collection_wait_timeout=0)
        assert trial.steps(show_incomplete_steps=True) == list(range(fail_at_step))
        assert not trial.training_ended  # the end marker could not be written either


# -- (d) bad configuration fails before training ----------------------------------------------
def _finished_run(tmp_path: Path) -> dict:
    done = tmp_path / "done"
    done.mkdir()
    (done / END_OF_TRAINING).write_text("")
    return {"out_dir": str(done)}


def _under_a_file(tmp_path: Path) -> dict:
    (tmp_path / "a_file").write_text("not a directory")
    return {"out_dir": str(tmp_path / "a_file" / "run")}


BAD_CONFIGS = {
    "unknown collection": (lambda tmp: {"include_collections": ["weights", "wieghts"]}, "'wieghts'"),
    "invalid regex": (lambda tmp: {"include_regex": ["fc1(("]}, "'fc1(('"),
    "invalid regex in list": (lambda tmp: {"include_regex": "[a-"}, "'[a-'"),
    "save_interval=0": (lambda tmp: {"save_config": tg.SaveConfig(save_interval=0)}, "save_interval=0"),
    "save_interval='abc'": (lambda tmp: {"save_config": tg.SaveConfig(save_interval="abc")}, "save_interval='abc'"),
    "save_steps": (lambda tmp: {"save_config": tg.SaveConfig(save_steps=[1, "x"])}, "save_steps='x'"),
    "negative start_step": (lambda tmp: {"save_config": tg.SaveConfig(start_step=-1)}, "start_step=-1"),
    "include_workers": (lambda tmp: {"include_workers": "some"}, "'some'"),
    "unknown reduction": (lambda tmp: {"reduction_config": tg.ReductionConfig(reductions=["median"])}, "'median'"),
    "unknown norm": (lambda tmp: {"reduction_config": tg.ReductionConfig(norms=["l3"])}, "'l3'"),
    "save_config type": (lambda tmp: {"save_config": {"save_interval": 1}}, "save_config"),
    "finished out_dir": (_finished_run, END_OF_TRAINING),
    "out_dir under a file": (_under_a_file, "a_file"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_raises_before_training(tmp_path, run_dir, case):
    make_kwargs, named = BAD_CONFIGS[case]
    hooks_before = len(torch_optimizer._global_optimizer_post_hooks)
    with pytest.raises(ConfigError) as raised:
        kwargs = {"out_dir": str(run_dir), **make_kwargs(tmp_path)}
        tg.Hook(**kwargs)
    assert named in str(raised.value)
    assert isinstance(raised.value, ValueError)  # code catching ValueError keeps working
    # nothing was left behind: no global optimizer hook, nothing written
    assert len(torch_optimizer._global_optimizer_post_hooks) == hooks_before
    assert not run_dir.exists() or not any(run_dir.iterdir())


def test_own_collection_defined_before_the_hook_is_known(make_hook, run_dir):
    manager = tg.CollectionManager.pytorch_defaults()
    manager.get("mine").include(r"^fc1_output_0$")
    hook = make_hook(
        collection_manager=manager, include_collections=["mine"], save_config=tg.SaveConfig(save_interval=1)
    )
    from tests.hooks._util import Net

    model = Net()
    hook.register_module(model)
    model(torch.randn(2, 4))
    hook.close()
    assert create_trial(run_dir).tensor_names() == ["fc1_output_0"]


# -- (e) backpressure -------------------------------------------------------------------------
class _RecordingQueue(deque):
    """The writer's queue; records pending bytes the moment a tensor is queued."""

    def __init__(self, writer):
        super().__init__()
        self.writer = writer

    def append(self, item):
        super().append(item)
        if item[0] in ("tensor", "reductions"):  # the kinds that count against max_pending_bytes
            nbytes = item[4]
            self.writer.largest_item = max(self.writer.largest_item, nbytes)
            self.writer.peak_pending = max(self.writer.peak_pending, self.writer._pending_bytes + nbytes)


class _CountingCondition(threading.Condition):
    def wait(self, timeout=None):
        if threading.current_thread() is threading.main_thread():
            self.training_thread_waits += 1
        return super().wait(timeout)


class InstrumentedWriter(hooks_writer.StepWriter):
    peak_pending = 0
    largest_item = 0

    def _reset_sync_state(self):
        super()._reset_sync_state()
        self._queue = _RecordingQueue(self)
        self._condition = _CountingCondition()
        self._condition.training_thread_waits = 0


class SlowStore:
    """Delegates to a real store; every write of an event file sleeps."""

    def __init__(self, store, delay):
        self._store = store
        self._delay = delay

    def open_writer(self, key):
        inner = self._store.open_writer(key)
        delay = self._delay

        class Slow:
            def write(self, data):
                time.sleep(delay)
                inner.write(data)

            def commit(self):
                inner.commit()

            def abort(self):
                inner.abort()

        return Slow()

    def __getattr__(self, name):
        return getattr(self._store, name)


class WideNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 64)  # 16 KiB of weights
        self.fc2 = nn.Linear(64, 64)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_backpressure_bounds_pending_bytes(make_hook, run_dir, monkeypatch):
    _pin_thread_writer(monkeypatch)
    monkeypatch.setattr(hooks_writer_opening, "StepWriter", InstrumentedWriter)
    limit = 40_000
    hook = make_hook(save_all=True, save_config=tg.SaveConfig(save_interval=1), max_pending_bytes=limit)
    hook.store = SlowStore(hook.store, delay=0.002)
    torch.manual_seed(0)
    model = WideNet()
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hook.register_module(model)
    hook.register_loss(criterion)
    steps = 6
    last_weights = None
    for _ in range(steps):
        last_weights = model.fc1.weight.detach().clone()
        optimizer.zero_grad()
        criterion(model(torch.randn(32, 64)), torch.randn(32, 64)).backward()
        optimizer.step()
    writer = hook._writer
    hook.close()

    assert isinstance(writer, InstrumentedWriter)
    assert writer.largest_item == 64 * 64 * 4
    # never more than the limit plus one item in memory (an item larger than the limit goes alone)
    assert writer.peak_pending <= limit + writer.largest_item
    assert writer.peak_pending <= max(limit, writer.largest_item)
    assert writer._condition.training_thread_waits > 0, "the training thread never waited: no backpressure tested"
    assert writer.failure is None and hook.enabled
    trial = create_trial(run_dir)
    assert trial.steps() == list(range(steps))
    np.testing.assert_array_equal(trial.tensor("WideNet_fc1.weight").value(steps - 1), as_numpy(last_weights))
    assert writer.steps_written == steps


def test_stuck_writer_disables_instead_of_hanging(make_hook, run_dir, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="trainguard")
    release = threading.Event()
    _pin_thread_writer(monkeypatch)
    monkeypatch.setattr(hooks_writer_opening, "StepWriter", _short_block_writer(0.5))
    hook = make_hook(save_all=True, save_config=tg.SaveConfig(save_interval=1), max_pending_bytes=1000)

    class Stuck(SlowStore):
        def open_writer(self, key):
            release.wait(30)
            return self._store.open_writer(key)

    hook.store = Stuck(hook.store, 0)
    torch.manual_seed(0)
    model = WideNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hook.register_module(model)
    started = time.monotonic()
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(4, 64)).sum().backward()
        optimizer.step()
    elapsed = time.monotonic() - started
    release.set()
    assert hook.enabled is False
    assert elapsed < 10
    warnings = trainguard_warnings(caplog)
    assert len(warnings) == 1 and "made no progress" in warnings[0].getMessage()


def _short_block_writer(seconds):
    class ShortBlock(hooks_writer.StepWriter):
        def __init__(self, *args, **kwargs):
            kwargs["max_block_seconds"] = seconds
            super().__init__(*args, **kwargs)

    return ShortBlock


# -- (f) fork safety --------------------------------------------------------------------------
class _PidRecordingStore(SlowStore):
    """Appends the writing process's pid to a log for every object written."""

    def __init__(self, store, log: Path):
        super().__init__(store, 0)
        self._log = str(log)

    def _record(self, key):
        fd = os.open(self._log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{os.getpid()} {key}\n".encode())
        finally:
            os.close(fd)

    def open_writer(self, key):
        self._record(key)
        return self._store.open_writer(key)

    def write(self, key, data):
        self._record(key)
        return self._store.write(key, data)


class _Augment(nn.Module):
    def forward(self, x):
        return x * 2.0 - 1.0


class _Data(Dataset):
    """Runs a module in the DataLoader worker: under zero-code capture that forward is seen by
    the hook in the forked child."""

    def __init__(self, use_module: bool):
        generator = torch.Generator().manual_seed(5)
        self.x = torch.rand(64, 4, generator=generator)
        self.y = torch.randint(0, 3, (64,), generator=generator)
        self.augment = _Augment() if use_module else None

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        x = self.x[index]
        if self.augment is not None:
            with torch.no_grad():
                x = self.augment(x)
        else:
            x = x * 2.0 - 1.0
        return x, self.y[index]


@pytest.mark.slow
@pytest.mark.parametrize("hook_class", [tg.Hook, ZeroCodeHook], ids=["Hook", "ZeroCodeHook"])
def test_dataloader_fork_workers_do_not_write(make_hook, run_dir, tmp_path, hook_class):
    log = tmp_path / "writes.log"
    hook = make_hook(cls=hook_class, save_config=tg.SaveConfig(save_interval=1))
    hook.store = _PidRecordingStore(hook.store, log)
    torch.manual_seed(0)
    from tests.hooks._util import Net

    model = Net()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if hook_class is tg.Hook:
        hook.register_module(model)
        hook.register_loss(criterion)
    loader = DataLoader(_Data(use_module=True), batch_size=16, num_workers=2, multiprocessing_context="fork")
    expected = []
    for _epoch in range(2):  # epoch 0 forks before the hook has a writer, epoch 1 after
        for x, y in loader:
            weights = model.fc1.weight.detach().clone()
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            expected.append((weights, loss.item()))
    hook.close()

    pids = {line.split()[0] for line in log.read_text().splitlines()}
    assert pids == {str(os.getpid())}, "a DataLoader worker wrote to the run"
    assert not list(run_dir.rglob(".*.tmp"))
    trial = create_trial(run_dir)
    assert trial.steps() == list(range(8))
    assert trial.modes() == [tg.modes.TRAIN]
    for step, (weights, loss) in enumerate(expected):
        np.testing.assert_array_equal(trial.tensor("Net_fc1.weight").value(step), as_numpy(weights))
        assert float(trial.tensor("CrossEntropyLoss_output_0").value(step)) == loss
