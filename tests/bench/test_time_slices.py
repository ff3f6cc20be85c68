"""bench/time_slices.py: variants take turns, whole process trees stop and go together."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from time_slices import run_in_turns  # noqa: E402

# A parent that starts a busy child, and both note the time as they run: every note must fall
# within the turns of its own variant. The parent's loop span is the child's lifetime.
_FAMILY = r"""
import subprocess, sys, time
log = open(sys.argv[1], "a")
if sys.argv[2:] == ["child"]:
    while time.process_time() < 0.6:  # CPU seconds: they do not pass while it is stopped
        spin = time.process_time() + 0.001
        while time.process_time() < spin:
            pass
        log.write(f"{time.perf_counter():.6f}\n")
    sys.exit(0)
started = time.perf_counter()
child = subprocess.Popen([sys.executable, __file__, sys.argv[1] + ".child", "child"])
while child.poll() is None:
    log.write(f"{time.perf_counter():.6f}\n")
    time.sleep(0.001)
print(f"BENCH_LOOP_SPAN={started:.6f} {time.perf_counter():.6f}", flush=True)
"""


def test_variants_take_turns_and_their_children_stop_with_them(tmp_path: Path) -> None:
    script = tmp_path / "family.py"
    script.write_text(_FAMILY)
    argvs = {name: [sys.executable, str(script), str(tmp_path / f"{name}.log")] for name in ("a", "b", "c")}
    cwd_of = {name: str(tmp_path) for name in argvs}
    runs = run_in_turns(argvs, cwd_of=cwd_of, env=dict(os.environ), slice_seconds=0.05)

    every_turn = sorted((a, b, name) for name, run in runs.items() for a, b in run.turns)
    for (_, end, _), (start, _, _) in zip(every_turn, every_turn[1:], strict=False):
        assert start >= end, "two variants ran at once"
    for name, run in runs.items():
        assert run.returncode == 0, run.text()
        assert len(run.turns) >= 5  # 0.6 s of child work in turns of 0.05 s
        span = run.loop_span()
        assert span is not None
        # its own turns within its span: at least the child's 0.6 s of work, far less than the span
        # (the other two variants had two turns in three)
        assert 0.55 < run.active_seconds(*span) < 0.75 * (span[1] - span[0])
        for log in (tmp_path / f"{name}.log", tmp_path / f"{name}.log.child"):
            notes = [float(line) for line in log.read_text().split()]
            assert notes, log
            # a note is written right after the time is read: 2 ms slack for a stop that lands between
            outside = [t for t in notes if not any(a - 0.002 <= t <= b + 0.002 for a, b in run.turns)]
            assert not outside, f"{log.name}: {len(outside)} of {len(notes)} notes while stopped"


def test_an_interrupted_run_leaves_no_process_behind(tmp_path: Path) -> None:
    argvs = {"sleeper": [sys.executable, "-c", "import time; time.sleep(60)"]}

    class Interrupt(Exception):
        pass

    import time_slices

    original = time_slices._take_turn

    def interrupted(run, slice_seconds):  # type: ignore[no-untyped-def]
        original(run, slice_seconds)
        raise Interrupt

    time_slices._take_turn = interrupted
    try:
        runs: dict = {}
        try:
            runs = run_in_turns(argvs, cwd_of={"sleeper": str(tmp_path)}, env=dict(os.environ), slice_seconds=0.05)
        except Interrupt:
            pass
    finally:
        time_slices._take_turn = original
    assert not runs
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _is_sleeper(p)]


def _is_sleeper(pid: str) -> bool:
    try:
        return "time.sleep(60)" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
