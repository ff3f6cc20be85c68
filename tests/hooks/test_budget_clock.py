"""The overhead budget's clock: the training thread's CPU time, plus what training waited for the
writer. Seconds in which the process does not run (stopped, its core given to another process,
asleep waiting for data) must make saves look neither cheaper nor costlier than they are."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from trainguard.hooks.overhead_budget import HEAVY, QUIET, OverheadBudget, TrainingThreadClock
from trainguard.modes import ModeKeys
from trainguard.storage import open_store
from trainguard.writer.process import ProcessStepWriter
from trainguard.writer.thread import StepWriter

from .test_fail_open import SlowStore


def _spin(seconds: float) -> None:
    """Use ``seconds`` of this thread's CPU time."""
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass


def test_the_clock_counts_cpu_time_and_not_sleep():
    clock = TrainingThreadClock()
    start = clock()
    time.sleep(0.3)
    slept = clock()
    _spin(0.2)
    spun = clock()
    assert slept - start < 0.05
    assert spun - slept >= 0.19


@pytest.mark.skipif(not hasattr(time, "pthread_getcpuclockid"), reason="no per-thread CPU clocks here")
def test_the_clock_reads_the_thread_that_first_read_it_from_any_thread():
    clock = TrainingThreadClock()
    clock()  # bound to this (the "training") thread
    readings: list[float] = []
    go = threading.Event()

    def other() -> None:
        readings.append(clock())
        _spin(0.2)  # the other thread's own CPU time is not the training thread's
        readings.append(clock())
        go.wait(10)
        readings.append(clock())

    thread = threading.Thread(target=other)
    thread.start()
    while len(readings) < 2:
        time.sleep(0.01)
    _spin(0.2)
    go.set()
    thread.join(10)
    assert readings[1] - readings[0] < 0.1  # this thread slept (mostly) while the other spun
    assert readings[2] - readings[1] >= 0.19  # ...and then spun 0.2 s of its own


def _wait_until_ready(writer: ProcessStepWriter) -> None:
    deadline = time.monotonic() + 30
    while writer.cost_seconds() is None:
        assert time.monotonic() < deadline, "the writer process did not start"
        time.sleep(0.02)


def _drive(budget: OverheadBudget, saves: int, *, step: float, save: float, stopped: float, gap: int = 10) -> None:
    """Marks as a hook makes them; each step uses ``step`` s of CPU, a heavy save ``save`` s more,
    and before each configured step the process is off its core for ``stopped`` s."""
    for index in range(saves * gap):
        kept = budget.keep(index) if index % gap == 0 else QUIET
        if kept == QUIET:
            if (index + 1) % gap in (0, 1, 2):
                budget.mark(index, QUIET)
        else:
            budget.mark(index, kept)
        _spin(step + (save if kept == HEAVY else 0.0))
        if (index + 1) % gap == 0:
            time.sleep(stopped)


def test_seconds_off_the_core_do_not_make_saves_look_cheap():
    # A save costs one extra step every 10 steps: 10 % of training. The process is also off its
    # core for 4 ms before each 10th step (another process's turn): on the wall clock that
    # time is training time too, and saving would read ~2 % of it.
    timing = dict(step=0.001, save=0.001, stopped=0.004)
    budget = OverheadBudget(0.05, warmup_saves=6)
    _drive(budget, 40, **timing)
    assert budget.heavy_stride >= 2  # thinned: half the heavy saves leave 5 %, the last window's share
    assert budget.last_share is not None and 0.03 <= budget.last_share <= 0.2, budget.last_share
    wall = OverheadBudget(0.05, warmup_saves=6, clock=time.perf_counter)  # what the budget did before
    _drive(wall, 40, **timing)
    assert wall.heavy_stride == 1 and wall.last_share is not None and wall.last_share < 0.03


def test_the_thread_writer_counts_the_time_training_waited_for_it(tmp_path):
    writer = StepWriter(SlowStore(open_store(tmp_path / "run"), 0.1), "worker_0", max_pending_bytes=100_000)
    try:
        started = time.monotonic()
        for step in range(4):  # each step fills the queue budget; each write takes 0.1 s
            writer.begin_step(step, ModeKeys.TRAIN, step)
            writer.add_tensor("x", np.ones(25_000, dtype=np.float32), nbytes=100_000)
            writer.end_step()
        elapsed = time.monotonic() - started
        cost = writer.cost_seconds()  # read while its thread runs: an ended thread has no clock
    finally:
        assert writer.close(30)
    assert 0.1 <= writer.blocked_seconds <= elapsed
    assert cost is not None and cost >= writer.blocked_seconds


def test_the_writer_process_counts_the_time_training_waited_for_it(tmp_path, monkeypatch):
    monkeypatch.setattr(ProcessStepWriter, "RING_BYTES", 1 << 20)
    writer = ProcessStepWriter(open_store(tmp_path / "run"), "worker_0", max_pending_bytes=1 << 20)
    _wait_until_ready(writer)
    before = writer.cost_seconds()
    assert before is not None and writer.blocked_seconds == 0.0
    os.kill(writer.pid, signal.SIGSTOP)  # the process takes nothing until it is continued
    resume = threading.Timer(0.4, os.kill, (writer.pid, signal.SIGCONT))
    resume.start()
    try:
        for step in range(20):  # 20 x 100 kB: twice the queue budget
            writer.begin_step(step, ModeKeys.TRAIN, step)
            writer.add_tensor("x", np.ones(25_000, dtype=np.float32), nbytes=100_000)
            writer.end_step()
    finally:
        resume.join()
        os.kill(writer.pid, signal.SIGCONT)
    assert writer.failure is None
    assert writer.blocked_seconds >= 0.3
    after = writer.cost_seconds()
    assert after is not None and after - before >= 0.3
    writer.write_object("collections/000000000/worker_0_collections.json", b'{"collections": {}}')
    assert writer.close(30)


def test_the_writer_process_start_up_is_not_a_cost_of_saving(tmp_path):
    writer = ProcessStepWriter(open_store(tmp_path / "run"), "worker_0")
    try:
        # right after the start: not ready yet, so an overhead budget's window does not count
        # the interpreter's start and imports as the cost of its first saves
        assert writer.cost_seconds() is None
        _wait_until_ready(writer)
    finally:
        writer.close(30)
