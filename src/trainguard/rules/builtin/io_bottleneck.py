"""IOBottleneck: the GPUs wait while the CPUs wait for I/O.

Formula (SageMaker's): snapshots as in CPUBottleneck (records within 20 ms); a snapshot is a
*bottleneck* when some GPU's ``GPUUtilization < gpu_threshold`` and some core's
``I/OWaitPercentage > io_threshold``. Once more than ``patience`` snapshots with GPU data were
seen, fire when ``100 · bottlenecks / snapshots > threshold``.

CPU-only machines: no GPU records, no datapoints, never fires (reported once), as CPUBottleneck.
"""

from __future__ import annotations

from trainguard.profiler import layout as L
from trainguard.rules.params import Param
from trainguard.rules.profiler_base import GpuIdleSnapshotRule, percent

__all__ = ["IOBottleneck"]


class IOBottleneck(GpuIdleSnapshotRule):
    """GPUs idle while the CPUs wait for disk or network I/O."""

    rule_name = "IOBottleneck"
    fix_hint = (
        "Read training data faster: copy it to local NVMe or use a streaming/pipe input mode, use "
        "larger record files (fewer small reads), and prefetch with DataLoader workers."
    )
    gpu_threshold = Param(float, 10.0, "a GPU below this utilization (%) counts as idle", check=percent,
                          documented_default=70.0)  # fmt: skip
    io_threshold = Param(float, 50.0, "a core with more I/O wait than this (%) counts as waiting", check=percent)
    busy_dimension = L.IO_WAIT
    busy_parameter = "io_threshold"
    what = "I/O wait"
