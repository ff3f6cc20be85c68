"""The dashboard's data layer without a browser: downsampling against a numpy oracle, curves read
incrementally from a real run (each step once), run status from the run's own files, advice
apart from issues, and the server's safety (loopback, CSP, Host check, no path traversal)."""

from __future__ import annotations

import json
import math
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from trainguard.modes import ModeKeys
from trainguard.ui import Dashboard, PathRuns, UiServer
from trainguard.ui.discover import discover_runs
from trainguard.ui.downsample import BoundedSeries
from trainguard.ui.findings import arrange
from trainguard.ui.live import LiveRun


# -- downsampling ----------------------------------------------------------------------------
def test_min_and_max_of_every_bucket_survive_and_memory_is_bounded() -> None:
    rng = np.random.default_rng(0)
    steps = np.arange(100_000)
    values = rng.normal(size=steps.size)
    values[12_345] = 50.0  # one spike: downsampling must not hide it
    series = BoundedSeries(max_buckets=500)
    for x, y in zip(steps.tolist(), values.tolist(), strict=True):
        series.add(x, y)
    xs, ys = series.points()
    assert len(xs) <= 1001 and len(series._buckets) <= 500  # two per bucket, and the latest point
    width = series.width
    for bucket in range(0, steps.size // width):
        window = values[bucket * width : (bucket + 1) * width]
        chosen = [y for x, y in zip(xs, ys, strict=True) if bucket * width <= x < (bucket + 1) * width]
        assert min(chosen) == window.min() and max(chosen) == window.max()
    assert 50.0 in ys
    assert (xs[-1], ys[-1]) == (99_999, values[-1])  # a live chart ends at the latest value


def test_every_bucket_with_a_nonfinite_value_keeps_a_marker_of_its_kind() -> None:
    series = BoundedSeries(max_buckets=50)
    expected = set()
    for x in range(10_000):
        y = float(x)
        if x % 997 == 0:
            y = math.nan
        elif x % 1499 == 0:
            y = math.inf
        series.add(x, y)
    for x in range(10_000):
        if x % 997 == 0:
            expected.add((x // series.width, "nan"))
        elif x % 1499 == 0:
            expected.add((x // series.width, "+inf"))
    assert {(int(x) // series.width, kind) for x, kind in series.markers()} == expected
    assert all(math.isfinite(y) for y in series.points()[1])


def test_points_do_not_depend_on_arrival_order() -> None:
    rng = np.random.default_rng(1)
    pairs = [(x, float(rng.normal())) for x in range(3000)]
    ordered, shuffled = BoundedSeries(100), BoundedSeries(100)
    for x, y in pairs:
        ordered.add(x, y)
    for index in rng.permutation(len(pairs)):
        shuffled.add(*pairs[index])
    assert ordered.points() == shuffled.points() and ordered.width == shuffled.width


# -- curves from a real run --------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from tests.report._run import train_run

    return train_run(tmp_path_factory.mktemp("ui-data") / "runs" / "small")


def test_curves_equal_the_trial_values_and_each_step_is_read_once(small_run: Path, monkeypatch) -> None:
    from trainguard.trial import create_trial

    run = LiveRun(discover_runs([str(small_run)])[0][0], budget_s=1e9)
    run.refresh(force=True)
    listing = run.listing
    calls: list[int] = []
    original = listing._read_step
    monkeypatch.setattr(listing, "_read_step", lambda step, *args: calls.append(step) or original(step, *args))
    run.refresh(force=True)
    assert calls == [], "a refresh with no new step must read no value"

    oracle = create_trial(str(small_run))
    charts = {chart["group"]: chart for chart in run.curves.charts()}
    (loss_name,) = oracle.tensor_names(collection="losses")
    by_label = {line["label"]: line for line in charts["losses"]["series"]}
    for mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
        line = by_label[f"{loss_name} · {mode.name}"]
        tensor = oracle.tensor(loss_name)
        expected = [float(tensor.value(oracle.global_step(mode, s))) for s in tensor.steps(mode=mode)]
        assert line["y"] == pytest.approx(expected)
    weight = oracle.tensor_names(collection="weights")[0]
    line = next(line for line in charts["weight_norms"]["series"] if line["label"] == weight)
    assert line["y"] == pytest.approx(
        [float(np.linalg.norm(oracle.tensor(weight).value(step).ravel())) for step in oracle.tensor(weight).steps()]
    )


def test_a_live_run_is_read_incrementally(small_run: Path, tmp_path: Path) -> None:
    """Copy a finished run's steps in two halves: the second refresh reads only the new ones."""
    from trainguard.trial import create_trial

    steps = create_trial(str(small_run)).steps()
    live = tmp_path / "live"
    shutil.copytree(small_run / "collections", live / "collections")

    def copy_steps(selected: list[int]) -> None:
        for step in selected:
            for folder in ("events", "index"):  # the event file first, as a writer does
                for path in (small_run / folder).rglob(f"{step:012d}_*"):
                    target = live / path.relative_to(small_run)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(path, target)

    half = len(steps) // 2
    copy_steps(steps[:half])
    run = LiveRun(discover_runs([str(live)])[0][0], budget_s=1e9)
    run.refresh(force=True)
    assert run.curves.cursor == steps[half - 1] == run.last_step
    assert run.status()[0] == "running"
    read: list[int] = []
    original = run.listing._read_step
    run.listing._read_step = lambda step, *args: read.append(step) or original(step, *args)
    copy_steps(steps[half:])
    shutil.copy(small_run / "training_job_end.ts", live / "training_job_end.ts")
    run.refresh(force=True)
    assert sorted(set(read)) == [s for s in steps if s > steps[half - 1]]
    assert run.status()[0] == "completed"


def test_status_follows_the_stop_and_exit_records(small_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(small_run, run_dir)
    location = discover_runs([str(run_dir)])[0][0]
    run = LiveRun(location)
    run.refresh(force=True)
    assert run.status()[0] == "completed"
    (run_dir / "trainguard-exit.json").write_text(json.dumps({"returncode": 1, "ended_at": 1.0}))
    run.refresh(force=True)
    assert run.status() == ("failed", "training exited with status 1")
    stop = {"configuration_name": "ExplodingTensor", "rule": "ExplodingTensor", "step": 10, "worker": "worker_0",
            "message": "m", "fix_hint": "f", "finding_reported_at": 100.0, "detected_at": 100.1, "signalled_at": 100.2,
            "stopped_at": 100.5}  # fmt: skip
    (run_dir / "trainguard-stop.json").write_text(json.dumps(stop))
    run.refresh(force=True)
    assert run.status()[0] == "stopped"
    assert run.stop_view()["delay_s"] == pytest.approx(0.5)


def test_a_folder_of_runs_and_a_sagemaker_job_folder_are_discovered(small_run: Path, tmp_path: Path) -> None:
    shutil.copytree(small_run, tmp_path / "runs" / "a")
    shutil.copytree(small_run, tmp_path / "runs" / "job-b" / "debug-output")
    (tmp_path / "runs" / "not-a-run").mkdir()
    found, problems = discover_runs([str(tmp_path / "runs"), str(tmp_path / "missing")])
    assert sorted(location.name for location in found) == ["a", "job-b"]
    assert problems and "missing" in problems[0]


# -- advice -------------------------------------------------------------------------------------
def test_advice_is_listed_apart_and_counted_as_no_issue() -> None:
    results = [
        {"configuration_name": "NotNormalizedData", "rule": "NotNormalizedData", "status": "NoIssuesFound",
         "findings": [{"step": 0, "fired": True, "advice": True, "certain": False,
                       "message": "inputs are not normalised", "fix_hint": "normalise the inputs"}]},
        {"configuration_name": "Overfit", "rule": "Overfit", "status": "Error",
         "status_details": "RuleNotEvaluated: needs losses of both TRAIN and EVAL steps", "findings": []},
        {"configuration_name": "TreeDepth", "rule": "TreeDepth", "status": "Error", "not_applicable": True,
         "status_details": "RuleNotEvaluated: applies to XGBoost runs only; this is a pytorch run", "findings": []},
    ]  # fmt: skip
    arranged = arrange(results)
    assert arranged["counts"] == {"rules": 3, "issues": 0, "advice": 1, "not_evaluated": 1, "not_applicable": 1}
    assert [r["not_applicable"] for r in arranged["rules"]] == [False, False, True]
    assert [item["rule"] for item in arranged["advice"]] == ["NotNormalizedData"]
    assert arranged["primary_line"] == ""
    assert arranged["rules"][1]["not_evaluated"] == "needs losses of both TRAIN and EVAL steps"


# -- the server ---------------------------------------------------------------------------------
def _get(url: str, host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_server_is_loopback_with_csp_host_check_and_no_traversal(small_run: Path) -> None:
    server = UiServer(Dashboard(PathRuns([str(small_run.parent)]))).start()
    try:
        assert server.httpd.server_address[0] == "127.0.0.1"
        status, headers, body = _get(server.url)
        assert status == 200 and b"static/list.js" in body and b"<script>" not in body
        csp = headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "connect-src 'self'" in csp
        status, _, body = _get(server.url + "api/runs")
        rows = json.loads(body)["runs"]
        assert status == 200 and [row["name"] for row in rows] == ["small"]
        status, _, body = _get(server.url + f"api/runs/{rows[0]['id']}/series")
        assert status == 200 and "NaN" not in body.decode() and json.loads(body)["charts"]
        assert _get(server.url + "api/runs", host=f"evil.example:{server.port}")[0] == 421
        for path in ("static/../__init__.py", "static/%2e%2e/server.py", "static/.hidden", "api/runs/nope"):
            assert _get(server.url + path)[0] == 404, path
    finally:
        server.close()
