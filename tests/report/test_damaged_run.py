"""A damaged step never costs the whole report: ``trainguard report`` leaves it out with a
warning naming it, writes the page, and shows every other step as the intact run does."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from trainguard.cli import main
from trainguard.format.layout import event_key, index_key
from trainguard.report import gather_report
from trainguard.report.charts import Chart
from trainguard.trial import create_trial

LOSS = "CrossEntropyLoss_output_0"


def _loss_points(charts: list[Chart]) -> dict[float, float]:
    chart = next(chart for chart in charts if chart.title == LOSS)
    return {x: y for series in chart.series for x, y in zip(series.x, series.y)}


def _damaged_copy(plain_run: Path, tmp_path: Path) -> tuple[Path, int]:
    """A copy of the run and a middle step that saved the loss (the step to damage)."""
    run = tmp_path / "run"
    shutil.copytree(plain_run, run)
    steps = create_trial(run).tensor(LOSS).steps()
    return run, steps[len(steps) // 2]


def _report(run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> tuple[str, list[str]]:
    output = tmp_path / "report.html"
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        assert main(["report", str(run), "-o", str(output)]) == 0
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    return output.read_text(encoding="utf-8"), warnings


def _points_without(plain_run: Path, step: int) -> dict[float, float]:
    intact = _loss_points(gather_report(plain_run).tensors.scalar_charts)
    assert float(step) in intact
    return {x: y for x, y in intact.items() if x != float(step)}


def test_event_file_cut_mid_record_skips_its_step_with_a_warning(plain_run: Path, tmp_path: Path, caplog) -> None:
    run, step = _damaged_copy(plain_run, tmp_path)
    event_file = run / event_key(step, "worker_0")
    data = event_file.read_bytes()
    event_file.write_bytes(data[: len(data) // 2 + 3])  # inside a record, not on a boundary

    page, warnings = _report(run, tmp_path, caplog)

    skipped = [
        message for message in warnings if message.startswith(f"trainguard: step {step} is left out of the charts:")
    ]
    assert len(skipped) == 1 and event_key(step, "worker_0") in skipped[0] and "file ends before" in skipped[0]
    assert f"Step {step} is left out of every chart" in page
    # every other step is shown exactly as in the intact run's report
    assert _loss_points(gather_report(run).tensors.scalar_charts) == _points_without(plain_run, step)


def test_truncated_index_skips_its_step_with_a_warning(plain_run: Path, tmp_path: Path, caplog) -> None:
    run, step = _damaged_copy(plain_run, tmp_path)
    index_file = run / index_key(step, "worker_0")
    data = index_file.read_bytes()
    index_file.write_bytes(data[: len(data) // 2])

    page, warnings = _report(run, tmp_path, caplog)

    assert any("unreadable index file" in message and index_key(step, "worker_0") in message for message in warnings)
    assert f"{index_key(step, 'worker_0')}: unreadable index file" in page
    assert _loss_points(gather_report(run).tensors.scalar_charts) == _points_without(plain_run, step)


def test_lost_index_is_named_in_the_report(plain_run: Path, tmp_path: Path, caplog) -> None:
    run, step = _damaged_copy(plain_run, tmp_path)
    (run / index_key(step, "worker_0")).unlink()

    page, warnings = _report(run, tmp_path, caplog)

    assert sum("has no index file" in message and f"step {step} of worker_0" in message for message in warnings) == 1
    assert f"{event_key(step, 'worker_0')}: event file without an index: step {step} of worker_0 is missing" in page
    assert _loss_points(gather_report(run).tensors.scalar_charts) == _points_without(plain_run, step)


def test_an_index_stripped_of_its_checksums_is_named_and_its_step_left_out(
    plain_run: Path, tmp_path: Path, caplog
) -> None:
    """The hook's run promises a checksum for every payload: an index without them is damage, and
    the report neither charts its (possibly altered) values nor hides that it left them out."""
    import json

    run, step = _damaged_copy(plain_run, tmp_path)
    index_file = run / index_key(step, "worker_0")
    document = json.loads(index_file.read_text())
    for entry in document["tensor_payload"]:
        del entry["crc32"]
    index_file.write_text(json.dumps(document))

    page, warnings = _report(run, tmp_path, caplog)

    assert sum("have no crc32" in message and index_key(step, "worker_0") in message for message in warnings) == 1
    assert f"{index_key(step, 'worker_0')}: index entries without the run's payload checksum" in page
    assert _loss_points(gather_report(run).tensors.scalar_charts) == _points_without(plain_run, step)


def test_a_capture_that_stopped_early_is_said_in_the_overview(plain_run: Path, tmp_path: Path, caplog) -> None:
    import json

    run, step = _damaged_copy(plain_run, tmp_path)
    (run / "capture_stopped").mkdir()
    (run / "capture_stopped" / "worker_0.json").write_text(
        json.dumps({"step": step, "reason": "StorageError: the disk is full", "time": 0.0})
    )
    page, _ = _report(run, tmp_path, caplog)
    assert "Capture stopped early" in page
    assert f"worker_0 captured nothing from step {step} on: StorageError: the disk is full" in page
