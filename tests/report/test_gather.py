"""The numbers a report shows are the numbers the trial holds (and the fixture files hold)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.report._fixtures import (
    OVERFIT_HINT,
    VANISHING_HINT,
    profiler_output_files,
    rule_output_files,
    system_samples,
)
from trainguard.errors import TrialError
from trainguard.modes import ModeKeys
from trainguard.report import build_page, gather_report
from trainguard.report.charts import Chart
from trainguard.report.tensors import pick_histogram_steps, subsample
from trainguard.trial import create_trial

LOSS = "CrossEntropyLoss_output_0"
WEIGHTS = ["Net_fc1.weight", "Net_fc2.weight", "Net_fc3.weight"]


def _chart(charts: list[Chart], title: str) -> Chart:
    found = [chart for chart in charts if chart.title == title]
    assert found, f"no chart {title!r} in {[chart.title for chart in charts]}"
    return found[0]


def _points(chart: Chart, label: str) -> dict[int, float]:
    series = [series for series in chart.series if series.label == label]
    assert series, f"no series {label!r} in {chart.title}: {[s.label for s in chart.series]}"
    return {int(x): y for x, y in zip(series[0].x, series[0].y, strict=True)}


def test_loss_and_metric_curves_per_mode_equal_the_trial(plain_run: Path) -> None:
    data = gather_report(plain_run)
    trial = create_trial(plain_run)
    for name in (LOSS, "scalar/accuracy"):
        chart = _chart(data.tensors.scalar_charts, name)
        modes_with_values = {trial.mode(step).name for step in trial.tensor(name).steps()}
        assert {series.label for series in chart.series} == modes_with_values
        for mode in modes_with_values:
            expected = {
                step: float(np.mean(trial.tensor(name).value(step)))
                for step in trial.tensor(name).steps()
                if trial.mode(step).name == mode
            }
            assert _points(chart, mode) == pytest.approx(expected, rel=1e-12)
    # the run has both modes for the loss, and accuracy only in EVAL
    assert {s.label for s in _chart(data.tensors.scalar_charts, LOSS).series} == {"TRAIN", "EVAL"}
    assert {s.label for s in _chart(data.tensors.scalar_charts, "scalar/accuracy").series} == {"EVAL"}


def test_weight_and_gradient_norms_equal_l2_of_the_saved_values(plain_run: Path) -> None:
    data = gather_report(plain_run)
    trial = create_trial(plain_run)
    for charts, names in (
        (data.tensors.weight_norm_charts, WEIGHTS),
        (data.tensors.gradient_norm_charts, trial.tensor_names(collection="gradients")),
        (data.tensors.bias_norm_charts, trial.tensor_names(collection="biases")),
    ):
        assert len(charts) == 1
        assert sorted(s.label for s in charts[0].series) == sorted(names)
        for name in names:
            expected = {
                step: float(np.sqrt(np.sum(trial.tensor(name).value(step).astype(np.float64) ** 2)))
                for step in trial.tensor(name).steps()
            }
            assert _points(charts[0], name) == pytest.approx(expected, rel=1e-9)
    # gradients exist only at TRAIN steps; weights at every saved step
    gradient_steps = set(_points(data.tensors.gradient_norm_charts[0], "gradient/Net_fc1.weight"))
    assert {trial.mode(step) for step in gradient_steps} == {ModeKeys.TRAIN}


def test_weight_histograms_count_every_value_at_first_middle_last_step(plain_run: Path) -> None:
    data = gather_report(plain_run)
    trial = create_trial(plain_run)
    saved = trial.tensor("Net_fc1.weight").steps()
    assert data.tensors.histogram_steps == [saved[0], saved[len(saved) // 2], saved[-1]]
    assert [chart.title for chart in data.tensors.histogram_charts] == [f"{name} distribution" for name in WEIGHTS]
    for name, chart in zip(WEIGHTS, data.tensors.histogram_charts, strict=True):
        assert [series.label for series in chart.series] == [f"step {step}" for step in data.tensors.histogram_steps]
        for series, step in zip(chart.series, data.tensors.histogram_steps, strict=True):
            value = trial.tensor(name).value(step).astype(np.float64).ravel()
            assert sum(series.y) == value.size
            expected, _ = np.histogram(value, bins=np.asarray(series.x))
            assert series.y == expected.tolist()
            assert series.x[0] <= value.min() and series.x[-1] >= value.max()
    # training moved the weights: the histograms of the first and last step differ
    first, last = data.tensors.histogram_charts[0].series[0], data.tensors.histogram_charts[0].series[-1]
    assert first.y != last.y


def test_requested_histogram_steps_snap_to_saved_steps_with_a_note(plain_run: Path) -> None:
    data = gather_report(plain_run, steps=[0, 7, 20, 999])
    last = create_trial(plain_run).tensor("Net_fc1.weight").steps()[-1]
    assert data.tensors.histogram_steps == [0, 6, 20, last]
    notes = " ".join(data.tensors.notes["histograms"])
    assert "step 7 has no saved weights; showing the nearest saved step 6" in notes
    assert f"step 999 has no saved weights; showing the nearest saved step {last}" in notes


def test_activation_zero_fraction_equals_the_share_of_zeros(plain_run: Path) -> None:
    data = gather_report(plain_run)
    trial = create_trial(plain_run)
    names = trial.tensor_names(collection="relu_output")
    assert names == ["relu1_output_0", "relu2_output_0"]
    chart = data.tensors.activation_charts[0]
    assert not chart.log_y
    for name in names:
        expected = {step: float(np.mean(trial.tensor(name).value(step) == 0)) for step in trial.tensor(name).steps()}
        assert _points(chart, name) == pytest.approx(expected, rel=1e-12)
    # the fixture's negative bias kills part of relu2: its curve is not all zeros
    assert max(_points(chart, "relu2_output_0").values()) > 0.1


def test_only_saved_reductions_feed_the_norms_and_histograms_say_why_they_are_missing(reductions_run: Path) -> None:
    data = gather_report(reductions_run)
    trial = create_trial(reductions_run)
    for name in WEIGHTS:
        expected = {step: float(trial.tensor(name).reduction_value(step, "l2")) for step in trial.tensor(name).steps()}
        assert expected, f"{name} has no saved reductions"
        assert _points(data.tensors.weight_norm_charts[0], name) == pytest.approx(expected, rel=1e-9)
    relu = _points(data.tensors.activation_charts[0], "relu2_output_0")
    assert relu == pytest.approx(
        {step: float(trial.tensor("relu2_output_0").reduction_value(step, "zero_fraction")) for step in relu}
    )
    assert data.tensors.histogram_charts == []
    assert "save_raw_tensor=True" in " ".join(data.tensors.notes["histograms"])


def test_subsampling_keeps_first_last_and_at_most_the_limit() -> None:
    steps = list(range(0, 3000, 3))
    picked = subsample(steps, 200)
    assert len(picked) <= 200 and picked[0] == 0 and picked[-1] == 2997
    assert set(picked) <= set(steps) and picked == sorted(picked)
    assert subsample([5, 1, 3], 200) == [1, 3, 5]
    assert pick_histogram_steps([], None) == ([], [])
    assert pick_histogram_steps([0, 10, 20, 30], None) == ([0, 20, 30], [])


def test_long_runs_are_read_at_most_max_points_steps_per_curve(plain_run: Path) -> None:
    data = gather_report(plain_run, max_points=5)
    trial = create_trial(plain_run)
    steps = sorted(_points(data.tensors.weight_norm_charts[0], "Net_fc1.weight"))
    saved = trial.tensor("Net_fc1.weight").steps()
    assert len(steps) == 5 and steps[0] == saved[0] and steps[-1] == saved[-1] and set(steps) <= set(saved)


def test_rule_findings_statuses_and_hints(full_run: Path) -> None:
    data = gather_report(full_run)
    by_name = {outcome.configuration_name: outcome for outcome in data.rule_outcomes}
    assert sorted(by_name) == ["DeadRelu", "LossNotDecreasing", "Overfit-eval", "VanishingGradient"]
    vanishing = by_name["VanishingGradient"]
    assert vanishing.status == "IssuesFound"
    assert [finding["step"] for finding in vanishing.fired] == [4, 12]  # the no-issue result is not a finding
    assert {finding["fix_hint"] for finding in vanishing.fired} == {VANISHING_HINT}
    assert by_name["Overfit-eval"].fired[0]["fix_hint"] == OVERFIT_HINT
    assert by_name["LossNotDecreasing"].status == "NoIssuesFound" and not by_name["LossNotDecreasing"].fired
    assert by_name["DeadRelu"].status == "Error" and by_name["DeadRelu"].missing[0]["collection"] == "relu_output"
    assert data.finding_problems == []
    page = build_page(str(full_run)).html  # its data inlined as JSON
    for text in (
        VANISHING_HINT,
        OVERFIT_HINT,
        "IssuesFound",
        "NoIssuesFound",
        "InsufficientInformation",
        "relu_output",
    ):
        assert json.dumps(text)[1:-1] in page


def test_a_broken_rule_file_is_reported_and_the_others_still_shown(full_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    (run / "rule-output" / "Half.json").write_text('{"configuration_name": "Half", "findings": [')
    (run / "rule-output" / "List.json").write_text("[1, 2]")
    data = gather_report(run)
    assert len(data.rule_outcomes) == 4
    assert len(data.finding_problems) == 2
    assert "Half.json is not a rule result file" in data.finding_problems[0]
    assert "List.json is not a rule result file: expected a JSON object" in data.finding_problems[1]


def test_system_metric_and_step_time_charts_equal_the_profiler_files(full_run: Path) -> None:
    data = gather_report(full_run)
    records = system_samples()
    origin = records[0]["Timestamp"]
    charts = {chart.title: chart for chart in data.profiler.system_charts}
    assert sorted(charts) == ["CPU utilization", "GPU memory used", "GPU utilization", "Host memory used", "I/O wait"]

    def expected(dimension: str, name: str | None = None) -> dict[float, float]:
        grouped: dict[float, list[float]] = {}
        for record in records:
            if record["Dimension"] == dimension and (name is None or record["Name"] == name):
                grouped.setdefault(record["Timestamp"] - origin, []).append(record["Value"])
        return {t: float(np.mean(v)) for t, v in grouped.items()}

    def shown(chart: Chart) -> dict[float, float]:
        (series,) = chart.series
        return dict(zip(series.x, series.y, strict=True))

    assert shown(charts["CPU utilization"]) == pytest.approx(expected("CPUUtilization"))
    assert shown(charts["I/O wait"]) == pytest.approx(expected("I/OWaitPercentage"))
    assert shown(charts["Host memory used"]) == pytest.approx(expected("Algorithm", "MemoryUsedPercent"))
    assert shown(charts["GPU utilization"]) == pytest.approx(expected("GPUUtilization"))
    assert len(shown(charts["CPU utilization"])) == 150  # both minute files were read

    (steps_chart,) = data.profiler.step_charts
    train = {int(x): y for x, y in zip(*[(s.x, s.y) for s in steps_chart.series if s.label == "TRAIN"][0], strict=True)}
    assert len(train) == 30
    assert train[7] == pytest.approx(40 + 2 * 2 + 25)  # ms: base 40, (7 % 5) * 2, the outlier's 25
    stats = {row["series"]: row for row in data.profiler.step_stats}
    assert stats["TRAIN"]["max_ms"] == pytest.approx(69.0) and stats["EVAL"]["steps"] == 12


def test_sections_without_data_say_so(plain_run: Path) -> None:
    data = gather_report(plain_run)
    detail = _detail(build_page(str(plain_run)).html)
    assert detail["rules_table"] == [] and detail["diagnosis"]["primary"] == []  # the page: "No rule results"
    assert any("the profiler was off" in note for note in detail["profiler"]["notes"])
    assert any("framework profiling was off" in note for note in detail["profiler"]["notes"])
    assert detail["profiler"]["charts"] == []
    assert data.profiler.system_charts == [] and data.profiler.step_charts == []


def test_profiler_only_run_and_sagemaker_job_layout(full_run: Path, tmp_path: Path) -> None:
    job = tmp_path / "job"
    shutil.copytree(plain_run_of(full_run), job / "debug-output")
    rule_output_files(job)
    profiler_output_files(job)
    data = gather_report(job / "debug-output")
    assert data.overview["steps"] > 0 and len(data.rule_outcomes) == 4 and data.profiler.system_charts

    profiler_only = tmp_path / "profiler-only"
    profiler_output_files(profiler_only)
    data = gather_report(profiler_only)
    assert data.overview == {} and "No tensors" in data.tensor_error
    detail = _detail(build_page(str(profiler_only)).html)
    assert "no collections file" in detail["problem"] and detail["profiler"]["charts"]
    assert data.profiler.step_charts

    with pytest.raises(TrialError, match="nothing to report"):
        gather_report(tmp_path / "nothing-here")


def plain_run_of(full_run: Path) -> Path:
    """A copy of the tensors of a run, without its rule and profiler folders."""
    target = full_run.parent / "tensors-only"
    if not target.exists():
        shutil.copytree(full_run, target, ignore=shutil.ignore_patterns("rule-output", "profiler-output"))
    return target


def test_every_drawn_point_has_finite_coordinates(full_run: Path) -> None:
    """The page's data is strict JSON: a point is finite, or null where it is not (the NaN/inf of a
    curve travel apart, as markers)."""
    page = build_page(str(full_run)).html
    documents = json.loads(page.split('id="tg-data">', 1)[1].split("</script>", 1)[0], parse_constant=_refuse)
    series = next(value for key, value in documents.items() if key.endswith("/series"))
    charts = series["charts"] + _detail(page)["profiler"]["charts"]
    assert sum(len(line["x"]) for chart in charts for line in chart["series"]) > 200
    for chart in charts:
        for line in chart["series"]:
            assert all(isinstance(x, (int, float)) and math.isfinite(x) for x in line["x"]), chart["title"]
            assert all(y is None or math.isfinite(y) for y in line["y"]), chart["title"]


def _refuse(token: str) -> float:
    raise AssertionError(f"{token} in the page's JSON")


def _detail(page: str) -> dict:
    documents = json.loads(page.split('id="tg-data">', 1)[1].split("</script>", 1)[0])
    return next(value for key, value in documents.items() if key.startswith("api/runs/") and key.count("/") == 2)


def test_big_runs_read_fewer_steps_within_the_byte_budget(plain_run: Path) -> None:
    overview = gather_report(plain_run).overview
    per_step = overview["bytes"] / overview["steps"]
    data = gather_report(plain_run, read_budget_bytes=int(per_step * 12) + 1)
    trial = create_trial(plain_run)
    steps = sorted(_points(data.tensors.weight_norm_charts[0], "Net_fc1.weight"))
    assert len(steps) == 12 and len(trial.tensor("Net_fc1.weight").steps()) == 21
    assert "Curves read 12 of the saved steps" in " ".join(data.tensors.notes["norms"])


def test_long_finding_lists_are_cut_with_a_count_of_what_is_left_out(tmp_path: Path) -> None:
    from trainguard.rules.base import StepResult

    findings = [
        StepResult("StepOutlier", step, True, f"step {step} took 9 s", "check the data loader").to_dict()
        for step in range(30)
    ]
    (tmp_path / "rule-output").mkdir()
    content = {
        "configuration_name": "StepOutlier",
        "rule": "StepOutlier",
        "status": "IssuesFound",
        "findings": findings,
    }
    (tmp_path / "rule-output" / "StepOutlier.json").write_text(json.dumps({**content, "dropped_findings": 5}))
    detail = _detail(build_page(str(tmp_path)).html)
    # the page leads with the diagnosis (the first finding); the rules table counts them all,
    # and the ones the runner left out of its file
    assert detail["diagnosis"]["primary"][0]["rule"] == "StepOutlier" and detail["diagnosis"]["primary"][0]["step"] == 0
    (row,) = detail["rules_table"]
    assert (row["findings"], row["first_step"], row["dropped"]) == (30, 0, 5)
