"""bench/instructions.py: callgrind counts the loop inside LoopTimer and nothing around it."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from instructions import build_helper, count  # noqa: E402

pytestmark = pytest.mark.skipif(
    shutil.which("valgrind") is None or (shutil.which("cc") or shutil.which("gcc")) is None,
    reason="needs valgrind and a C compiler",
)

# Work before and after the timed loop that dwarfs the loop: none of it may be counted.
_SCRIPT = r"""
import sys
from bench.stacks._timing import LoopTimer
def work(n):
    total = 0
    for i in range(n):
        total += i * i
    return total
work(500_000)
with LoopTimer():
    work(int(sys.argv[1]))
work(500_000)
"""


def test_the_count_covers_the_loop_only_and_grows_with_it(tmp_path: Path) -> None:
    helper = build_helper(str(tmp_path))
    script = tmp_path / "loop.py"
    script.write_text(_SCRIPT)
    counts = {}
    for iterations in (20_000, 40_000):
        directory = tmp_path / str(iterations)
        directory.mkdir()
        # the shorter run with the cache simulation too: its estimated cycles cover the same loop
        simulate = iterations == 20_000
        counts[iterations] = count([sys.executable, str(script), str(iterations)], helper, str(directory), simulate)
    small, large = counts[20_000]["loop"], counts[40_000]["loop"]
    assert small > 0 and counts[20_000]["children"] == 0
    # twice the iterations, twice the instructions: the calls around the loop (25 times the
    # loop's work each) are outside the count
    assert 1.8 < large / small < 2.2, (small, large)
    assert small < 5_000 * 20_000, small  # hundreds of instructions per iteration, not the 1 M around it
    simulated = counts[20_000]
    assert simulated["Ir"] == small and "D1mr" in simulated and "Bcm" in simulated
    assert small < simulated["cycles"] < 10 * small
