"""Writes gpu_two_nodes/: a synthesised two-node, one-GPU-each run in SageMaker's layout.

    python tests/profiler/data/make_gpu_two_nodes.py     # (re)creates the committed files

120 samples at 500 ms per node. algo-1 trains well (GPU 85-100 %, memory 40 % that jumps by
30 points at sample 110: a leak); algo-2's GPU idles (5-35 %, memory 20 %) while its CPUs are
lightly loaded. Used by test_recorded_gpu.py for the GPU-only rules on a CPU-only machine.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tests.profiler._synthetic import START, write_system  # noqa: E402

N = 120


def main() -> None:
    target = HERE / "gpu_two_nodes"
    shutil.rmtree(target, ignore_errors=True)
    rng = np.random.default_rng(2020)
    memory = 40 + rng.normal(0, 0.3, N)
    memory[110:] += 30  # SageMaker's overlapping windows see about a fifth of a jump
    busy = {
        ("gpu0", "GPUUtilization"): rng.uniform(85, 100, N),
        ("gpu0", "GPUMemoryUtilization"): memory,
        ("cpu0", "CPUUtilization"): rng.uniform(60, 95, N),
        ("cpu0", "I/OWaitPercentage"): rng.uniform(0, 5, N),
        ("cpu", "TotalCPUUtilization"): rng.uniform(60, 90, N),
    }
    idle = {
        ("gpu0", "GPUUtilization"): rng.uniform(5, 35, N),
        ("gpu0", "GPUMemoryUtilization"): 20 + rng.normal(0, 0.3, N),
        ("cpu0", "CPUUtilization"): rng.uniform(10, 40, N),
        ("cpu0", "I/OWaitPercentage"): rng.uniform(0, 5, N),
        ("cpu", "TotalCPUUtilization"): rng.uniform(10, 40, N),
    }
    write_system(target, busy, node="algo-1", start=START)
    write_system(target, idle, node="algo-2", start=START + 0.2)


if __name__ == "__main__":
    main()
