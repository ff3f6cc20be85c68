"""Run the variants of a benchmark at the same time, taking turns: drift then hits them alike.

This machine's speed drifts within minutes (other tenants of the host), so two runs of the same
command back to back differ by more than the overheads to measure (bench/RESULTS.md). Here every
variant's command is started at once, but only one variant's whole process tree runs at any
moment: the others are stopped (SIGSTOP to every process of their trees), and the turn passes
every ``slice_seconds``. Each variant's time is the sum of its turns that fall within its own
measured span (its training loop: a ``BENCH_LOOP_SPAN=<start> <end>`` line of
``time.perf_counter`` values, which on Linux is CLOCK_MONOTONIC and shared by all processes), so
every variant is timed on the same mix of fast and slow minutes.

A variant's processes run alone while it has the turn, the writer process and rule runner of a
``trainguard run`` included (they belong to its tree); a process started by a running one is
found and stopped with it when the turn passes. What this cannot hide: the first instants after
a turn begins run on caches the other variants used (the same for every variant, about a
millisecond per turn of one second), and a hook that measures its own cost in wall time sees the
stopped seconds whenever a turn ends inside the span it measures (rare with one-second turns;
the overhead budget only ever thins saves more for it).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SlicedRun", "run_in_turns"]

_SPAN = re.compile(r"BENCH_LOOP_SPAN=([0-9.]+) ([0-9.]+)")
_POLL_SECONDS = 0.01


@dataclass
class SlicedRun:
    """One variant's process, its turns and what it printed."""

    argv: list[str]
    process: subprocess.Popen
    output: tempfile._TemporaryFileWrapper
    turns: list[tuple[float, float]] = field(default_factory=list)
    returncode: int | None = None
    peak_rss_mib: float = 0.0

    def active_seconds(self, start: float | None = None, end: float | None = None) -> float:
        """Seconds this variant ran within [start, end] (all of its turns when not given)."""
        low, high = start if start is not None else float("-inf"), end if end is not None else float("inf")
        return sum(max(0.0, min(b, high) - max(a, low)) for a, b in self.turns)

    def text(self) -> str:
        self.output.seek(0)
        return self.output.read()

    def loop_span(self) -> tuple[float, float] | None:
        match = _SPAN.search(self.text())
        return (float(match.group(1)), float(match.group(2))) if match else None


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # the command name (2nd field) is in parentheses and may hold spaces
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(entry))
    return children


def _tree(root: int) -> list[int]:
    children, found, todo = _children_map(), [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _signal_tree(root: int, signum: int) -> None:
    """Signal every process of ``root``'s tree; for SIGSTOP until no new process appears (one
    forked between our listing and its parent's stop is caught by the next listing)."""
    done: set[int] = set()
    while True:
        pids = [pid for pid in _tree(root) if pid not in done]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
            done.add(pid)
        if signum != signal.SIGSTOP:
            return


def run_in_turns(
    argvs: dict[str, list[str]], *, cwd_of: dict[str, str], env: dict[str, str], slice_seconds: float = 1.0
) -> dict[str, SlicedRun]:
    """Start every command at once and let them take turns until all have exited."""
    runs: dict[str, SlicedRun] = {}
    try:
        for name, argv in argvs.items():
            output = tempfile.TemporaryFile(mode="w+")
            process = subprocess.Popen(argv, cwd=cwd_of[name], env=env, stdout=output, stderr=subprocess.STDOUT,
                                       text=True, start_new_session=True)  # fmt: skip
            _signal_tree(process.pid, signal.SIGSTOP)  # it ran a few ms unsliced: start-up, not measured
            runs[name] = SlicedRun(argv, process, output)
        while any(run.returncode is None for run in runs.values()):
            for run in runs.values():
                if run.returncode is None:
                    _take_turn(run, slice_seconds)
    finally:
        for run in runs.values():
            if run.returncode is None:  # interrupted: leave nothing stopped behind
                _signal_tree(run.process.pid, signal.SIGKILL)
                _signal_tree(run.process.pid, signal.SIGCONT)
                run.process.wait()
    return runs


def _take_turn(run: SlicedRun, slice_seconds: float) -> None:
    pid = run.process.pid
    began = time.perf_counter()
    _signal_tree(pid, signal.SIGCONT)
    deadline = began + slice_seconds
    while True:
        waited, status, usage = os.wait4(pid, os.WNOHANG)
        if waited == pid:
            run.turns.append((began, time.perf_counter()))
            run.returncode = os.waitstatus_to_exitcode(status)
            run.peak_rss_mib = usage.ru_maxrss / 1024
            return
        now = time.perf_counter()
        if now >= deadline:
            break
        time.sleep(min(_POLL_SECONDS, deadline - now))
    _signal_tree(pid, signal.SIGSTOP)
    run.turns.append((began, time.perf_counter()))
