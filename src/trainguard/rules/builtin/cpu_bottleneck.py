"""CPUBottleneck: the GPUs wait while the CPU is saturated.

Formula (SageMaker's): the records of one system sample (within 20 ms) form a snapshot. A
snapshot is a *bottleneck* when some GPU's ``GPUUtilization < gpu_threshold`` and some core's
``CPUUtilization > cpu_threshold``. Once more than ``patience`` snapshots with GPU data were
seen, the rule fires when ``100 · bottlenecks / snapshots > threshold``.

CPU-only machines: without GPU records there are no datapoints, so the rule never fires (an idle
GPU is half of the condition); it reports that once. Data-loading stalls on CPU-only runs are
caught by ``Dataloader`` (share of step time waiting for data) and ``StepOutlier``.
"""

from __future__ import annotations

from trainguard.rules.params import Param
from trainguard.rules.profiler_base import GpuIdleSnapshotRule, percent

__all__ = ["CPUBottleneck"]


class CPUBottleneck(GpuIdleSnapshotRule):
    """GPUs idle while a CPU core is saturated (CPU-side preprocessing limits training)."""

    rule_name = "CPUBottleneck"
    fix_hint = (
        "Move preprocessing off the training process (DataLoader num_workers, or precompute/cache "
        "features), use GPU-side augmentation, or choose an instance with more CPU cores per GPU."
    )
    cpu_threshold = Param(float, 90.0, "a core above this utilization (%) counts as saturated", check=percent)
