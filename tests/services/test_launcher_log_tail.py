"""A component's log tail is read from the end: a describe of a job with a huge log reads a bound,
not the log; and the tail holds the same lines as splitting the whole log would give."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from trainguard.services.launchers.base import ComponentSpec, ComponentState, JobLaunch
from trainguard.services.launchers.local import LocalLauncher
from trainguard.services.launchers.log_tail import read_log

from tests.services.conftest import wait_for


def _bytes_read() -> int:
    """Bytes this process has read through read(2)/pread(2) so far (the kernel's count)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/<pid>/io")
def test_a_tail_of_a_huge_log_reads_only_its_end(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path / "local")
    launcher.start(JobLaunch("big", (ComponentSpec("training", "", (sys.executable, "-c", "print('start')")),)))
    wait_for(lambda: launcher.status("big")["training"].state is ComponentState.EXITED, 60, "the component to exit")
    log = tmp_path / "local" / "big" / "training" / "output.log"
    with open(log, "r+b") as handle:  # 256 MiB of log (sparse: no disk), then the newest lines
        handle.truncate(256 << 20)
        handle.seek(0, 2)
        handle.write(b"\nstep 1 loss 0.5\r\nstep 2 loss 0.25\nstep 3 loss 0.125\n")
    before = _bytes_read()
    tail = launcher.logs("big", "training", tail=2)
    read = _bytes_read() - before
    assert tail == "step 2 loss 0.25\nstep 3 loss 0.125\n"
    assert read < 1 << 20, f"{read} bytes read for a 2-line tail of a 256 MiB log"
    # One line longer than the bound: its newest part, and no more than the bound is read.
    before = _bytes_read()
    newest = read_log(log, 1, max_bytes=1 << 20)
    assert _bytes_read() - before <= 1 << 20
    assert newest.endswith("step 3 loss 0.125\n") and len(newest) <= 1 << 20


def test_a_tail_holds_the_lines_splitting_the_whole_log_gives(tmp_path: Path) -> None:
    pieces = ["a", "bb", "é", "日本", "\n", "\r\n", "\r", "\x0c", "\u2028", "x" * 40, "\n\n"]
    randomness = random.Random(44)
    log = tmp_path / "output.log"
    for _ in range(60):
        text = "".join(randomness.choice(pieces) for _ in range(randomness.randint(0, 80)))
        log.write_bytes(text.encode())
        whole = log.read_text(errors="replace")
        assert read_log(log) == whole
        lines = whole.splitlines(keepends=True)
        for tail in (1, 2, 3, 7, 50, 1000):
            for block in (1, 2, 3, 5, 64):
                assert read_log(log, tail, block_bytes=block) == "".join(lines[-tail:]), (text, tail, block)
    assert read_log(log, 0) == "" and read_log(tmp_path / "missing.log", 5) == ""
