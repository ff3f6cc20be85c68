"""The writer process (writer/process.py, writer_child.py): the same run as the thread
writer, bounded memory, and fail-open under the faults a separate process adds (it dies, it
fails, it stalls, the training process dies, a fork holds its pipe, shared memory is full)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import trainguard.pytorch as tg
import trainguard.writer.process as writer_process
import trainguard.writer.ring as ring
from trainguard.errors import ConfigError
from trainguard.format.tensor_codec import DT_BFLOAT16
from trainguard.hooks.torch_tensors import DeferredReductions
from trainguard.modes import ModeKeys
from trainguard.reductions import reduce_array
from trainguard.storage import open_store
from trainguard.trials import create_trial
from trainguard.writer.opening import open_step_writer
from trainguard.writer.process import ProcessStepWriter
from trainguard.writer.thread import StepWriter

REQUESTED = (("min", False), ("max", False), ("mean", False), ("std", False), ("l2", False), ("l1", True))


def _tensors(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    return {
        "float32": rng.standard_normal((64, 32)).astype(np.float32),
        "float16": rng.standard_normal(100).astype(np.float16),
        "int64": rng.integers(-5, 5, (7, 3)),
        "bool": rng.random(17) > 0.5,
        "scalar": np.array(step * 0.5, dtype=np.float64),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "strided": rng.standard_normal((20, 20)).astype(np.float32)[:, ::2],
        "large": rng.standard_normal(300_000).astype(np.float32),  # > a quarter of a 1 MiB ring
    }


def _write_steps(writer, steps: int = 4, *, bulk: bool = False) -> None:
    for step in range(steps):
        writer.begin_step(step, ModeKeys.TRAIN, step)
        if bulk:  # add_tensors: the same tensors in one call, one of them as a callable source
            items = [(name, array, array.nbytes, None) for name, array in _tensors(step).items()]
            items[0] = (items[0][0], lambda array=items[0][1]: array, items[0][2], None)
            writer.add_tensors(items)
        else:
            for name, array in _tensors(step).items():
                writer.add_tensor(name, array, nbytes=array.nbytes)
        bits = torch.randn(10, generator=torch.Generator().manual_seed(step)).bfloat16()
        writer.add_tensor("bf16", bits.view(torch.int16).numpy().view(np.uint16), nbytes=20, proto_dtype=DT_BFLOAT16)
        source = torch.randn(50, 40, generator=torch.Generator().manual_seed(100 + step))
        names = [f"reduced/{name}{'_abs' if absolute else ''}" for name, absolute in REQUESTED]
        writer.add_reductions(names, DeferredReductions(source.clone(), REQUESTED))
        writer.add_reductions(["given/a", "given/b"], np.array([step, -step], dtype=np.float64))
        writer.add_reductions(["deferred/a"], lambda step=step: np.array([step * 2.0]))
        writer.end_step()


def _values(run) -> dict[tuple[str, int], np.ndarray]:
    trial = create_trial(str(run), collection_wait_timeout=0)
    return {(name, step): trial.tensor(name).value(step) for name in trial.tensor_names() for step in trial.steps()}


def _finish(writer) -> None:
    writer.write_object("collections/000000000/worker_0_collections.json", b'{"collections": {}}')
    assert writer.close(30)


@pytest.fixture
def small_ring(monkeypatch):
    monkeypatch.setattr(ProcessStepWriter, "RING_BYTES", 1 << 20)


@pytest.mark.parametrize("bulk", [False, True], ids=["one_by_one", "add_tensors"])
def test_the_same_run_as_the_thread_writer(tmp_path, small_ring, bulk):
    thread = StepWriter(open_store(tmp_path / "thread"), "worker_0")
    process = ProcessStepWriter(open_store(tmp_path / "process"), "worker_0")
    assert process.ring_size == 1 << 20
    for writer in (thread, process):
        _write_steps(writer, bulk=bulk)
        _finish(writer)
    expected, got = _values(tmp_path / "thread"), _values(tmp_path / "process")
    assert sorted(got) == sorted(expected) and len(got) == 4 * 18
    for key, value in expected.items():
        if key[0].startswith("reduced/"):  # torch's float32 kernels (thread) vs numpy in float64
            np.testing.assert_allclose(got[key], value, rtol=1e-6, atol=1e-7, err_msg=str(key))
        else:  # everything else bit for bit
            np.testing.assert_array_equal(got[key], value, err_msg=str(key))
    assert process.steps_written == thread.steps_written == 4
    assert process.bytes_written == thread.bytes_written


def test_reductions_match_the_numpy_reference(tmp_path):
    writer = ProcessStepWriter(open_store(tmp_path / "run"), "worker_0")
    _write_steps(writer, steps=2)
    _finish(writer)
    values = _values(tmp_path / "run")
    for step in range(2):
        source = torch.randn(50, 40, generator=torch.Generator().manual_seed(100 + step)).numpy()
        reference = reduce_array(source, REQUESTED)
        got = [values[(f"reduced/{name}{'_abs' if absolute else ''}", step)] for name, absolute in REQUESTED]
        np.testing.assert_allclose(np.array(got, dtype=np.float64), reference, rtol=1e-12)
        assert values[("given/b", step)] == -step and values[("deferred/a", step)] == 2.0 * step


def test_the_ring_wraps_and_applies_backpressure(tmp_path, small_ring):
    writer = ProcessStepWriter(open_store(tmp_path / "run"), "worker_0", max_pending_bytes=1 << 20)
    arrays = [np.full(50_000, step, dtype=np.float32) for step in range(120)]  # 200 kB each: 24 MB in all
    for step, array in enumerate(arrays):
        writer.begin_step(step, ModeKeys.TRAIN, step)
        writer.add_tensor("x", array, nbytes=array.nbytes)
        writer.add_tensor("y", array[:777], nbytes=777 * 4)
        writer.end_step()
        assert writer._pending() <= 1 << 20
    _finish(writer)
    assert writer.failure is None
    values = _values(tmp_path / "run")
    for step, array in enumerate(arrays):
        np.testing.assert_array_equal(values[("x", step)], array)
        np.testing.assert_array_equal(values[("y", step)], array[:777])


def test_one_add_tensors_call_larger_than_the_ring_waits_and_keeps_every_tensor(tmp_path, small_ring):
    # 30 x 200 kB in one call through a 1 MiB ring: the call must send what it placed so far
    # (the process frees only what it was told about) and go on in a new message.
    writer = ProcessStepWriter(open_store(tmp_path / "run"), "worker_0", max_pending_bytes=1 << 20)
    for step in range(3):
        arrays = [np.full(50_000, step * 100 + index, dtype=np.float32) for index in range(30)]
        writer.begin_step(step, ModeKeys.TRAIN, step)
        writer.add_tensors([(f"t{index}", array, array.nbytes, None) for index, array in enumerate(arrays)])
        writer.end_step()
    _finish(writer)
    assert writer.failure is None
    values = _values(tmp_path / "run")
    assert len(values) == 3 * 30
    for (name, step), value in values.items():
        np.testing.assert_array_equal(value, np.full(50_000, step * 100 + int(name[1:]), dtype=np.float32))


def test_a_step_larger_than_the_ring_does_not_wait_for_the_writer_process(tmp_path, small_ring):
    """A full ring spills into tensors' own shared-memory files while the queue budget allows:
    a saved step of a CNN's activations (several times the ring) used to hold training up until
    the writer process, behind the rule runner on the other core, had caught up."""
    errors = _Errors()
    writer = ProcessStepWriter(open_store(tmp_path / "run"), "worker_0", max_block_seconds=1.0, on_error=errors)
    assert writer.flush(30)
    arrays = [np.full(50_000, index, dtype=np.float32) for index in range(20)]  # 20 x 200 kB: 4 x the ring
    os.kill(writer.pid, signal.SIGSTOP)  # the process takes nothing while the step is handed over
    try:
        started = time.monotonic()
        writer.begin_step(0, ModeKeys.TRAIN, 0)
        for index, array in enumerate(arrays):
            writer.add_tensor(f"a{index}", array, nbytes=array.nbytes)
        writer.end_step()
        assert time.monotonic() - started < 0.9 and not errors, "waited for ring space"
    finally:
        os.kill(writer.pid, signal.SIGCONT)
    _finish(writer)
    assert writer.failure is None and not errors
    values = _values(tmp_path / "run")
    for index, array in enumerate(arrays):
        np.testing.assert_array_equal(values[(f"a{index}", 0)], array)


def test_full_shared_memory_sends_large_tensors_down_the_pipe(tmp_path, small_ring, monkeypatch):
    allocate = writer_process.allocate_shared_file

    def full_for_tensors(size, prefix):
        if prefix == "trainguard-tensor-":
            raise OSError(28, "No space left on device")
        return allocate(size, prefix)

    monkeypatch.setattr(writer_process, "allocate_shared_file", full_for_tensors)
    writer = ProcessStepWriter(open_store(tmp_path / "run"), "worker_0")
    _write_steps(writer, steps=2)
    _finish(writer)
    values = _values(tmp_path / "run")
    np.testing.assert_array_equal(values[("large", 1)], _tensors(1)["large"])


def test_no_shared_memory_is_left_behind(tmp_path, small_ring):
    shm = writer_process.shared_memory_dir()
    before = {name for name in os.listdir(shm) if name.startswith("trainguard-")}
    writer = ProcessStepWriter(open_store(tmp_path / "run"), "worker_0")
    _write_steps(writer, steps=2)
    _finish(writer)
    assert {name for name in os.listdir(shm) if name.startswith("trainguard-")} <= before


class _Errors(list):
    def __call__(self, error: BaseException) -> None:
        self.append(error)


def _write_until_failed(writer, first_step: int, limit: float = 20.0) -> int:
    """Keep 'training' until the writer reports a failure; every call returns promptly."""
    deadline = time.monotonic() + limit
    step = first_step
    while writer.failure is None and time.monotonic() < deadline:
        started = time.monotonic()
        writer.begin_step(step, ModeKeys.TRAIN, step)
        writer.add_tensor("x", np.full(1000, step, dtype=np.float32), nbytes=4000)
        writer.end_step()
        assert time.monotonic() - started < writer.max_block_seconds + 2
        step += 1
        time.sleep(0.01)
    return step


def test_a_killed_writer_process_disables_capture(tmp_path):
    errors = _Errors()
    writer = ProcessStepWriter(open_store(tmp_path / "run"), "worker_0", on_error=errors)
    _write_until_failed(writer, 0, limit=0.3)
    assert writer.flush(30) and writer.failure is None
    os.kill(writer.pid, signal.SIGKILL)
    _write_until_failed(writer, 100)
    assert len(errors) == 1 and "writer process exited with code -9" in str(errors[0])
    assert not writer.active
    writer.close(5)  # returns at once, writes nothing more
    steps = sorted(int(name.split("_")[0]) for name in os.listdir(tmp_path / "run" / "index" / "000000000"))
    assert steps and all(step < 100 for step in steps)


def test_a_failing_writer_process_says_why(tmp_path):
    errors = _Errors()
    root = tmp_path / "run"
    writer = ProcessStepWriter(open_store(root), "worker_0", on_error=errors)
    (root / "events").write_text("not a directory")  # the event files cannot be created (even as root)
    _write_until_failed(writer, 0)
    assert len(errors) == 1 and str(errors[0]).startswith("writer process failed:"), errors
    assert "events" in str(errors[0])
    assert writer.close(5) is True
    assert writer._process.returncode == 0  # it drained the pipe and exited when told


def test_a_stalled_writer_process_times_out_instead_of_hanging_training(tmp_path, small_ring):
    errors = _Errors()
    writer = ProcessStepWriter(
        open_store(tmp_path / "run"), "worker_0", max_pending_bytes=1 << 20, max_block_seconds=1.0, on_error=errors
    )
    assert writer.flush(30)
    os.kill(writer.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        for step in range(40):  # 40 x 100 kB: more than the ring holds
            writer.begin_step(step, ModeKeys.TRAIN, step)
            writer.add_tensor("x", np.ones(25_000, dtype=np.float32), nbytes=100_000)
            writer.end_step()
        assert time.monotonic() - started < 5
        assert len(errors) == 1 and isinstance(errors[0], TimeoutError), errors
    finally:
        os.kill(writer.pid, signal.SIGCONT)
    writer.close(5)


def test_the_steps_ended_before_the_training_process_died_are_written(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, numpy as np
        from trainguard.writer.process import ProcessStepWriter
        from trainguard.modes import ModeKeys
        from trainguard.storage import open_store
        writer = ProcessStepWriter(open_store({str(tmp_path / "run")!r}), "worker_0")
        for step in range(4):
            writer.begin_step(step, ModeKeys.TRAIN, step)
            writer.add_tensor("x", np.full(100_000, step, dtype=np.float32), nbytes=400_000)
            if step < 3:
                writer.end_step()
        print(writer.pid, flush=True)
        os._exit(0)  # no close, no atexit: as if killed
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    child = int(done.stdout.split()[0])
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the writer process outlived the training process"
    index = tmp_path / "run" / "index" / "000000000"
    assert sorted(os.listdir(index)) == [f"{step:012d}_worker_0.json" for step in range(3)]
    assert not list((tmp_path / "run").rglob("*.tmp")), "the open step left its temp file"
    store = open_store(tmp_path / "run")
    store.write("collections/000000000/worker_0_collections.json", b'{"collections": {}}')
    values = _values(tmp_path / "run")
    for step in range(3):
        np.testing.assert_array_equal(values[("x", step)], np.full(100_000, step, dtype=np.float32))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie (not yet reaped by init) has ended
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_worker_neither_writes_nor_keeps_the_writer_process_alive(tmp_path):
    writer = ProcessStepWriter(open_store(tmp_path / "run"), "worker_0")
    pid = os.fork()
    if pid == 0:  # a DataLoader worker, say: its copy is disabled and holds no pipe
        code = 0 if not writer.active else 3
        writer.begin_step(99, ModeKeys.TRAIN, 99)
        writer.end_step()
        time.sleep(4)
        os._exit(code)
    try:
        _write_until_failed(writer, 0, limit=0.2)
        started = time.monotonic()
        _finish(writer)
        assert time.monotonic() - started < 3, "close waited for the forked worker"
        assert writer._process.returncode == 0
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert "000000000099_worker_0.json" not in os.listdir(tmp_path / "run" / "index" / "000000000")


def test_writer_choice(tmp_path, monkeypatch):
    assert type(open_step_writer(open_store("memory://choice"), "worker_0", kind="process")) is StepWriter
    writer = open_step_writer(open_store(tmp_path / "a"), "worker_0", kind="auto")
    assert type(writer) is ProcessStepWriter
    writer.close(5)
    with pytest.raises(ConfigError, match="writer='fast'"):
        tg.Hook(out_dir=str(tmp_path / "b"), writer="fast")
    monkeypatch.setenv("TRAINGUARD_WRITER", "nope")
    with pytest.raises(ConfigError, match="TRAINGUARD_WRITER"):
        tg.Hook(out_dir=str(tmp_path / "c"))


def _saved(run) -> dict[tuple[str, int], np.ndarray]:
    """Every saved value: raw tensors, and reductions (saved without their raw tensor)."""
    trial = create_trial(str(run), collection_wait_timeout=0)
    values = {}
    for name in trial.tensor_names():
        tensor = trial.tensor(name)
        for step in tensor.steps():
            try:
                values[(name, step)] = tensor.value(step)
            except Exception:  # noqa: BLE001 - a tensor saved as reductions only
                for (reduction, absolute), value in tensor.reduction_values(step).items():
                    values[(f"reduction/{reduction}/{absolute}/{name}", step)] = value
    return values


def _train(out_dir, writer: str) -> tg.Hook:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    hook = tg.Hook(
        out_dir=str(out_dir),
        save_config=tg.SaveConfig(save_interval=2),
        include_collections=["weights", "biases", "gradients", "losses", "outputs", "relu_output"],
        reduction_config=tg.ReductionConfig(
            reductions=["min", "max", "mean", "std"],
            abs_reductions=["mean"],
            norms=["l2"],
            abs_norms=["l1"],
            save_raw_tensor=False,
        ),  # fmt: skip
        writer=writer,
    )
    hook.register_module(model)
    loss_fn = torch.nn.CrossEntropyLoss()
    hook.register_loss(loss_fn)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(9):
        optimizer.zero_grad()
        loss_fn(model(torch.randn(5, 8)), torch.randint(0, 3, (5,))).backward()
        optimizer.step()
    hook.close()
    return hook


def test_a_hook_with_the_writer_process_saves_what_the_thread_writer_saves(tmp_path):
    thread, process = _train(tmp_path / "thread", "thread"), _train(tmp_path / "process", "process")
    assert type(process._writer) is ProcessStepWriter and type(thread._writer) is StepWriter
    expected, got = _saved(tmp_path / "thread"), _saved(tmp_path / "process")
    assert sorted(got) == sorted(expected)
    assert any("/gradient/" in name for name, _ in got) and any("_output_0" in name for name, _ in got)
    assert any(name.startswith("reduction/l1/True/") for name, _ in got)
    for key, value in expected.items():
        if key[0].startswith("reduction/"):  # torch's kernels (thread) vs numpy in float64 (process)
            np.testing.assert_allclose(got[key], value, rtol=2e-6, atol=1e-7, err_msg=str(key))
        else:
            np.testing.assert_array_equal(got[key], value, err_msg=str(key))


def test_small_steps_reuse_the_start_of_the_ring(tmp_path):
    """Once the process has released everything, the next tensor goes to the ring's start: a
    model with small steps keeps touching the same pages instead of all of the ring."""
    writer = ProcessStepWriter(open_store(tmp_path / "run"), "worker_0")
    starts = []
    for step in range(30):
        writer.begin_step(step, ModeKeys.TRAIN, step)
        array = np.full(3000, step, dtype=np.float32)
        writer.add_tensor("x", array, nbytes=array.nbytes)
        starts.append(writer._batch[-1][2][1])  # the ring offset the tensor was copied to
        writer.end_step()
        assert writer.flush(30)
    _finish(writer)
    assert starts[0] == 0 and set(starts[1:]) == {0}, starts
    values = _values(tmp_path / "run")
    assert [float(values[("x", step)][0]) for step in range(30)] == list(range(30))


def test_tensors_handed_over_from_several_threads_all_arrive(tmp_path, small_ring):
    """Hooks may fire on several threads (nn.DataParallel's replicas): no placement is lost or
    overwritten while the ring wraps."""
    import threading

    writer = ProcessStepWriter(open_store(tmp_path / "run"), "worker_0")
    writer.begin_step(0, ModeKeys.TRAIN, 0)

    def hand_over(thread: int) -> None:
        for index in range(40):
            array = np.full(20_000, thread * 1000 + index, dtype=np.float32)
            writer.add_tensor(f"t{thread}_{index}", array, nbytes=array.nbytes)

    threads = [threading.Thread(target=hand_over, args=(number,)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.end_step()
    _finish(writer)
    values = _values(tmp_path / "run")
    assert len(values) == 160
    for (name, _), value in values.items():
        thread, index = (int(part) for part in name[1:].split("_"))
        np.testing.assert_array_equal(value, np.full(20_000, thread * 1000 + index, dtype=np.float32))


def _started(writer: ProcessStepWriter) -> bool:
    deadline = time.monotonic() + 30
    while not writer._slots[ring.SLOT_READY] and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(writer._slots[ring.SLOT_READY])


def test_the_writer_process_runs_niced_as_background_work(tmp_path, monkeypatch):
    writer = ProcessStepWriter(open_store(tmp_path / "a"), "worker_0")
    assert _started(writer)
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, writer.pid) == min(19, own + ProcessStepWriter.NICE)
    writer.close(5)
    monkeypatch.setenv("TRAINGUARD_WRITER_NICE", "0")
    writer = ProcessStepWriter(open_store(tmp_path / "b"), "worker_0")
    assert _started(writer) and os.getpriority(os.PRIO_PROCESS, writer.pid) == own
    writer.close(5)
    monkeypatch.setenv("TRAINGUARD_WRITER_NICE", "-5")  # not allowed: the default, with a warning
    writer = ProcessStepWriter(open_store(tmp_path / "c"), "worker_0")
    assert writer.nice == ProcessStepWriter.NICE
    writer.close(5)
