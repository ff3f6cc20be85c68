"""Long runs in the dashboard's data layer: what the server keeps after reading a run does not
grow with the run's length, the curves still match a numpy oracle (min/max per bucket, the
non-finite markers, the latest point), and steps of several workers are read once each, when
every worker wrote them."""

from __future__ import annotations

import gc
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from trainguard.config.collections import Collection, CollectionManager
from trainguard.format.layout import END_OF_TRAINING, collections_key
from trainguard.modes import ModeKeys
from trainguard.storage import open_store
from trainguard.ui.discover import discover_runs
from trainguard.ui.live import LiveRun
from trainguard.writer.step_file import StepFile

LOSS, WEIGHT = "CrossEntropyLoss_output_0", "fc.weight"
NAN_STEP = 3_333


def _losses(steps: int) -> np.ndarray:
    values = 2.0 + np.sin(np.arange(steps) / 50.0) + np.random.default_rng(0).normal(0, 0.1, steps)
    values[min(NAN_STEP, steps - 1)] = math.nan
    return values


def write_run(path: Path, steps: int, workers: tuple[str, ...] = ("worker_0",), end: bool = True) -> np.ndarray:
    """A synthetic run written by the hook's own step writer: a loss and a 4x4 weight per step."""
    store = open_store(str(path))
    manager = CollectionManager([Collection("losses", include_regex=[LOSS]), Collection("weights", [WEIGHT])])
    for worker in workers:
        store.write(collections_key(worker), manager.render(len(workers), "pytorch"))
    losses = _losses(steps)
    write_steps(store, losses, range(steps), workers)
    if end:
        store.write(END_OF_TRAINING, b"")
    return losses


def write_steps(store, losses: np.ndarray, steps, workers: tuple[str, ...]) -> None:  # noqa: ANN001
    for worker in workers:
        writer = StepFile(store, worker)
        for step in steps:
            writer.begin(step, ModeKeys.TRAIN, step)
            writer.tensor(LOSS, np.float32(losses[step]))
            writer.tensor(WEIGHT, np.full((4, 4), step / 1000.0, dtype=np.float32))
            writer.end()


def read_all(path: Path) -> LiveRun:
    run = LiveRun(discover_runs([str(path)])[0][0], budget_s=float("inf"))
    for _ in range(100):
        run.refresh(force=True)
        if run.last_step is not None and run.curves.cursor >= run.last_step:
            return run
    raise AssertionError(f"not read to the end: cursor {run.curves.cursor}, last step {run.last_step}")


def kept_bytes(root: object) -> int:
    """Bytes of every object reachable from ``root`` (classes, modules and functions aside): what
    the server keeps for one run, whatever other threads of this process allocate meanwhile."""
    skipped = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
    seen: set[int] = set()
    stack, total = [root], 0
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, skipped):
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        stack.extend(gc.get_referents(item))
    return total


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, np.ndarray]]:
    root = tmp_path_factory.mktemp("long-runs")
    return {steps: (root / f"run-{steps}", write_run(root / f"run-{steps}", steps)) for steps in (500, 5_000)}


def test_what_the_server_keeps_does_not_grow_with_the_run(runs: dict[int, tuple[Path, np.ndarray]]) -> None:
    short = kept_bytes(read_all(runs[500][0]))
    run = read_all(runs[5_000][0])
    long = kept_bytes(run)
    assert run.steps == 5_000 and run.status()[0] == "completed"
    # ten times the steps: the listing of every step (a trial keeps one entry per tensor per
    # step) would add megabytes; bounded curves and a bounded tail of recent steps add little
    assert long - short < 2**20, f"500 steps keep {short / 2**20:.2f} MiB, 5,000 keep {long / 2**20:.2f} MiB"


def test_long_curves_keep_min_max_markers_and_the_latest_point(runs: dict[int, tuple[Path, np.ndarray]]) -> None:
    path, losses = runs[5_000]
    run = read_all(path)
    (line,) = next(chart for chart in run.curves.charts() if chart["group"] == "losses")["series"]
    width = line["width"]
    assert width > 1 and len(line["x"]) <= 2 * run.curves.max_buckets + 1
    for bucket in range(len(losses) // width):
        window = losses[bucket * width : (bucket + 1) * width]
        finite = window[np.isfinite(window)]
        drawn = [y for x, y in zip(line["x"], line["y"], strict=True) if bucket * width <= x < (bucket + 1) * width]
        assert min(drawn) == pytest.approx(finite.min()) and max(drawn) == pytest.approx(finite.max())
    assert line["nonfinite"] == [[NAN_STEP, "nan"]]
    assert (line["x"][-1], line["y"][-1]) == (4_999, pytest.approx(losses[-1]))
    (norm,) = next(chart for chart in run.curves.charts() if chart["group"] == "weight_norms")["series"]
    assert norm["y"][-1] == pytest.approx(4 * 4.999)  # ||4x4 of 4.999|| = 4 * 4.999
    tensors = {item["name"]: item["steps"] for item in run.histogram_tensors()}
    assert list(tensors) == [WEIGHT] and tensors[WEIGHT] == list(range(3_000, 5_000))  # the recent tail
    histogram = run.histogram(WEIGHT, 4_321)
    assert histogram["size"] == 16 and sum(histogram["counts"]) == 16
    assert histogram["edges"][0] < 4.321 < histogram["edges"][-1] and histogram["nan"] == 0


def test_steps_of_several_workers_are_drawn_once_every_worker_wrote_them(tmp_path: Path) -> None:
    workers = ("worker_0", "worker_1")
    losses = write_run(tmp_path, 10, workers=("worker_0",), end=False)
    store = open_store(str(tmp_path))
    manager = CollectionManager([Collection("losses", include_regex=[LOSS]), Collection("weights", [WEIGHT])])
    for worker in workers:  # a run of two workers; the second is behind
        store.write(collections_key(worker), manager.render(2, "pytorch"))
    write_steps(store, losses, range(5), ("worker_1",))
    run = LiveRun(discover_runs([str(tmp_path)])[0][0], budget_s=float("inf"))
    read: list[tuple[int, str]] = []
    run.refresh(force=True)
    original = run.listing._read_step
    run.listing._read_step = lambda step, worker, *args: read.append((step, worker)) or original(step, worker, *args)
    run.refresh(force=True)
    assert run.last_step == 4 and run.curves.cursor == 4 and run.status()[0] == "running"
    labels = {line["label"] for line in run.curves.charts()[0]["series"]}
    assert labels == {f"{LOSS} · TRAIN · worker_0", f"{LOSS} · TRAIN · worker_1"}
    write_steps(store, losses, range(5, 10), ("worker_1",))
    store.write(END_OF_TRAINING, b"")
    run.refresh(force=True)
    assert sorted(read) == [(step, worker) for step in range(5, 10) for worker in workers]
    assert run.last_step == 9 and run.steps == 10 and run.status()[0] == "completed"
