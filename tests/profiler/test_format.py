"""The profiler's files: SageMaker's layouts, atomic visibility, readers, stores."""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from tests.profiler._loops import train
from trainguard.errors import ConfigError
from trainguard.profiler import (
    Profiler,
    StepTimingReader,
    SystemMetricsReader,
    metric_series,
    read_step_timings,
    read_system_metrics,
)
from trainguard.profiler.output import LocalOutput, SystemMetricsWriter
from trainguard.storage import MemoryStore

DATA = Path(__file__).parent / "data"
SAGEMAKER_FIELDS = {"Type", "Name", "Dimension", "Value", "NodeId", "Timestamp"}
SYSTEM_NAME = re.compile(r"^system/incremental/(\d{10})/(\d+)\.node-a\.json$")
FRAMEWORK_NAME = re.compile(r"^framework/pevents/(\d{10})/(\d+)_0-node-a_pythontimeline\.json$")


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_profiled_loop_writes_sagemaker_layout(tmp_path: Path) -> None:
    with Profiler(tmp_path, interval_ms=100, node_id="node-a", rank=0):
        train(30)
        time.sleep(0.25)  # at least two samples, so rates (CPU %) exist
    root = tmp_path / "profiler-output"
    files = _files(root)
    system = [f for f in files if f.startswith("system/")]
    framework = [f for f in files if f.startswith("framework/")]
    assert system and framework and len(system) + len(framework) == len(files), files
    for name in system:
        hour, minute = SYSTEM_NAME.match(name).groups()
        assert int(minute) % 60 == 0 and hour == time.strftime("%Y%m%d%H", time.gmtime(int(minute)))
        for line in (root / name).read_text().splitlines():
            record = json.loads(line)
            assert set(record) == SAGEMAKER_FIELDS and record["NodeId"] == "node-a"
            assert 60 * (record["Timestamp"] // 60) == int(minute)
    for name in framework:
        assert FRAMEWORK_NAME.match(name), name
        events = json.loads((root / name).read_text())  # a complete JSON array
        assert events[0]["name"] == "process_name" and "start_time_since_epoch_in_micros" in events[0]["args"]

    metrics = read_system_metrics(tmp_path)
    dimensions = {m.dimension for m in metrics}
    assert {"CPUUtilization", "I/OWaitPercentage", "Algorithm", "TotalCPUUtilization"} <= dimensions
    cores = {m.name for m in metrics if m.dimension == "CPUUtilization"}
    assert cores == {f"cpu{i}" for i in range(len(cores))} and len(cores) >= 1
    assert all(0.0 <= m.value <= 100.0 for m in metrics if m.dimension == "CPUUtilization")
    # one timestamp per sample, samples about 100 ms apart
    stamps = np.unique([m.timestamp for m in metrics])
    assert len(stamps) >= 3 and np.median(np.diff(stamps)) == pytest.approx(0.1, abs=0.05)

    steps = read_step_timings(tmp_path)
    train_steps = [s for s in steps if s.mode == "TRAIN"]
    assert [s.step for s in train_steps] == list(range(30))
    for s in train_steps:
        parts = s.data + s.forward + s.backward + s.optimizer
        assert s.forward > 0 and s.backward > 0 and s.optimizer > 0
        assert parts <= s.duration + 2e-6, s
        assert s.dataloader_workers == 0
    # steps follow each other: each starts where the previous one ended
    for before, after in zip(train_steps, train_steps[1:], strict=False):
        assert after.start == pytest.approx(before.end, abs=2e-6)


def test_slow_dataset_shows_as_data_time(tmp_path: Path) -> None:
    with Profiler(tmp_path, interval_ms=500, system=False):
        train(6, batch=4, item_delay_s=0.01)
    steps = [s for s in read_step_timings(tmp_path) if s.mode == "TRAIN"]
    assert len(steps) == 6
    # 4 items x 10 ms per batch: at least 40 ms of each step is waiting for data
    assert all(s.data >= 0.04 for s in steps[1:]), steps


def test_reads_sagemaker_files(tmp_path: Path) -> None:
    """Files as SageMaker wrote them: string step numbers, no phase split, an unclosed trace."""
    shutil.copytree(DATA / "sagemaker_run", tmp_path, dirs_exist_ok=True)
    root = tmp_path / "profiler-output"
    metrics = read_system_metrics(root)  # the profiler-output folder works as well as the run
    assert [(m.name, m.dimension, m.value, m.node) for m in metrics] == [
        ("cpu0", "CPUUtilization", 4.76, "algo-1"),
        ("gpu0", "GPUUtilization", 90.0, "algo-1"),
    ]
    (step,) = read_step_timings(tmp_path)
    assert (step.node, step.rank, step.mode, step.step) == ("algo-1", 1, "TRAIN", 12)
    assert step.start == pytest.approx(1591160600.001) and step.duration == pytest.approx(0.25)
    assert np.isnan(step.forward) and step.dataloader_workers is None
    series = metric_series(metrics, "GPUUtilization")
    assert list(series) == [("algo-1", "gpu0")] and series[("algo-1", "gpu0")][1].tolist() == [90.0]


def test_incremental_reader_never_returns_half_a_line(tmp_path: Path) -> None:
    output = LocalOutput(tmp_path / "profiler-output")
    writer = SystemMetricsWriter(output, "n1")
    reader = SystemMetricsReader(tmp_path)
    assert reader.read_new() == []
    writer.write_sample(1_700_000_000.0, [("cpu", "cpu0", "CPUUtilization", 10.0)])
    assert [m.value for m in reader.read_new()] == [10.0]
    key = next((tmp_path / "profiler-output").rglob("*.json"))
    with open(key, "ab") as handle:  # a writer caught mid-line
        handle.write(b'{"Type": "cpu", "Name": "cpu0", "Dimension": "CPUUtil')
    assert reader.read_new() == []
    with open(key, "ab") as handle:
        handle.write(b'ization", "Value": 20.0, "NodeId": "n1", "Timestamp": 1700000001.0}\n')
    writer.write_sample(1_700_000_002.0, [("cpu", "cpu0", "CPUUtilization", 30.0)])
    assert [m.value for m in reader.read_new()] == [20.0, 30.0]
    # the next minute goes to a new file
    writer.write_sample(1_700_000_065.0, [("cpu", "cpu0", "CPUUtilization", 40.0)])
    assert [m.value for m in reader.read_new()] == [40.0]
    assert len(list((tmp_path / "profiler-output").rglob("*.json"))) == 2
    output.close()


def test_timeline_rotation_keeps_every_step(tmp_path: Path) -> None:
    with Profiler(tmp_path, interval_ms=100, system=False, rotate_interval_s=0.15) as profiler:
        reader = StepTimingReader(tmp_path)
        # step 10 outlasts the rotation interval: whatever the machine's speed, steps 0-9 are
        # closed into one file while it runs, the rest into another
        train(20, slow_steps=frozenset({10}), slow_step_s=0.6)
        time.sleep(0.35)
        seen_live = reader.read_new()  # closed files are visible while the run goes on
    seen_after = reader.read_new()
    files = list((tmp_path / "profiler-output/framework").rglob("*.json"))
    assert len(files) >= 2 and profiler.timeline.rotate_interval_s == 0.15
    steps = [s.step for s in seen_live + seen_after if s.mode == "TRAIN"]
    assert sorted(steps) == list(range(20)) and len(seen_live) >= 1


def test_store_output_rewrites_minute_files(tmp_path: Path) -> None:
    store = MemoryStore("profiler-test")
    with Profiler(store, interval_ms=100, flush_interval_s=0.2):
        reader = SystemMetricsReader(store)
        train(10)
        time.sleep(0.6)
        live = reader.read_new()
    after = reader.read_new()
    assert live, "minute files are rewritten while the run goes on"
    keys = store.list("profiler-output/")
    assert any(k.startswith("profiler-output/system/incremental/") for k in keys)
    assert any(k.startswith("profiler-output/framework/pevents/") for k in keys)
    everything = read_system_metrics(store)
    # the incremental reader saw each record exactly once
    assert sorted((m.timestamp, m.name, m.dimension) for m in live + after) == sorted(
        (m.timestamp, m.name, m.dimension) for m in everything
    )
    assert [s.step for s in read_step_timings(store) if s.mode == "TRAIN"] == list(range(10))


def test_s3_output(s3_endpoint: str, s3_bucket: str) -> None:
    url = f"s3://{s3_bucket}/runs/job1"
    with Profiler(url, interval_ms=100, endpoint_url=s3_endpoint):
        train(5)
        time.sleep(0.25)
    metrics = read_system_metrics(url, endpoint_url=s3_endpoint)
    steps = read_step_timings(url, endpoint_url=s3_endpoint)
    assert any(m.dimension == "CPUUtilization" for m in metrics)
    assert [s.step for s in steps if s.mode == "TRAIN"] == list(range(5))


@pytest.mark.parametrize("interval", [50, "fast", 0])
def test_bad_interval_is_a_config_error(tmp_path: Path, interval) -> None:
    with pytest.raises(ConfigError, match="interval_ms"):
        Profiler(tmp_path, interval_ms=interval)


def test_unwritable_output_fails_open(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        with Profiler(blocker, interval_ms=100) as profiler:
            train(5)  # must not raise
            time.sleep(0.2)
    assert not profiler.enabled
    assert "profiler" in caplog.text and "training continues" in caplog.text
