"""Synthetic profiler output written with trainguard's own writers (the real file format)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from trainguard.profiler.output import LocalOutput, SystemMetricsWriter
from trainguard.profiler.timeline import TimelineWriter

START = 1_700_000_000.0  # a fixed epoch so file names are reproducible
DIMENSION_TYPE = {"GPUUtilization": "gpu", "GPUMemoryUtilization": "gpu"}


def write_system(
    run: Path,
    series: Mapping[tuple[str, str], np.ndarray],
    *,
    node: str = "algo-1",
    start: float = START,
    interval_s: float = 0.5,
    first: int = 0,
    count: int | None = None,
) -> None:
    """``series[(name, dimension)]`` = values per sample; writes samples ``first:first+count``."""
    length = len(next(iter(series.values())))
    stop = length if count is None else min(length, first + count)
    output = LocalOutput(run / "profiler-output")
    writer = SystemMetricsWriter(output, node)
    for index in range(first, stop):
        metrics = [
            (DIMENSION_TYPE.get(dimension, "cpu"), name, dimension, float(values[index]))
            for (name, dimension), values in series.items()
        ]
        writer.write_sample(start + index * interval_s, metrics)
    writer.close()
    output.close()


def write_steps(
    run: Path,
    durations: Sequence[float],
    *,
    data: Sequence[float] | None = None,
    workers: int | None = 0,
    mode: str = "TRAIN",
    start: float = START,
    rank: int = 0,
    host: str = "algo-1",
    first_step: int = 0,
) -> float:
    """One closed timeline file with consecutive steps; returns the end time of the last step."""
    output = LocalOutput(run / "profiler-output")
    timeline = TimelineWriter(output.write_file, rank, host)
    t = start
    for index, duration in enumerate(durations):
        waited = data[index] if data is not None else 0.0
        busy = duration - waited  # split 50/40/10 between forward, backward and optimizer
        args = {"step_num": first_step + index, "data_us": int(waited * 1e6), "forward_us": int(busy * 5e5),
                "backward_us": int(busy * 4e5), "optimizer_us": int(busy * 1e5)}  # fmt: skip
        if workers is not None:
            args["dataloader_workers"] = workers
        timeline.record(f"Step:ModeKeys.{mode}", f"Step:ModeKeys.{mode}", t, t + duration, args)
        t += duration
    timeline.rotate(now=t + 0.001)
    return t
