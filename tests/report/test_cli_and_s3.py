"""``trainguard report`` as a command: local and s3:// runs, options, and errors that say what to fix."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainguard.cli import main
from trainguard.commands.report import parse_steps
from trainguard.errors import ConfigError
from trainguard.report import gather_report


def _upload(directory: Path, endpoint: str, bucket: str, prefix: str) -> int:
    from tests.s3_server import s3_client

    client = s3_client(endpoint)
    files = [path for path in sorted(directory.rglob("*")) if path.is_file()]
    for path in files:
        client.put_object(
            Bucket=bucket, Key=f"{prefix}/{path.relative_to(directory).as_posix()}", Body=path.read_bytes()
        )
    return len(files)


def _charts(data) -> list[tuple]:
    sections = (data.tensors, data.profiler)
    return [
        (chart.title, [(series.label, series.x, series.y) for series in chart.series])
        for section in sections
        for field in dataclasses.fields(section)
        if field.name.endswith("charts")
        for chart in getattr(section, field.name)
    ]


def test_report_of_an_s3_run_equals_the_local_report(
    full_run: Path, s3_endpoint: str, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("TRAINGUARD_CACHE_DIR", str(tmp_path / "cache"))
    assert _upload(full_run, s3_endpoint, s3_bucket, "jobs/full-run") > 10
    output = tmp_path / "out" / "s3-report.html"
    url = f"s3://{s3_bucket}/jobs/full-run"
    assert main(["report", url, "-o", str(output), "--endpoint-url", s3_endpoint, "--steps", "0,20"]) == 0
    assert "4 rule result(s), 3 finding(s)" in capsys.readouterr().err
    page = output.read_text()
    # the page's data: the run's documents, inlined as JSON (the charts are drawn from them)
    assert url in page and "Use ReLU-family activations" in page and '"id":"chart-cpu-utilization"' in page

    remote = gather_report(url, endpoint_url=s3_endpoint, steps=[0, 20])
    local = gather_report(full_run, steps=[0, 20])
    assert _charts(remote) == _charts(local)
    assert len(_charts(local)) >= 15  # 2 scalars, 3 norms, 3 histograms, 1 activation, 5 system, 1 step time
    assert [o.configuration_name for o in remote.rule_outcomes] == [o.configuration_name for o in local.rule_outcomes]
    assert [o.fired for o in remote.rule_outcomes] == [o.fired for o in local.rule_outcomes]


def test_steps_option_is_parsed_and_bad_values_name_the_fix() -> None:
    assert parse_steps("0, 50,100") == [0, 50, 100]
    assert parse_steps("") is None and parse_steps(None) is None
    with pytest.raises(ConfigError, match=r"'x' is not a step number; give global steps like 0,50,100"):
        parse_steps("0,x")
    with pytest.raises(ConfigError, match="step -3 is negative"):
        parse_steps("-3")


def test_cli_errors_exit_2_with_a_message(plain_run: Path, tmp_path: Path, capsys) -> None:
    assert main(["report", str(plain_run), "-o", str(tmp_path / "r.html"), "--steps", "1,a"]) == 2
    assert "'a' is not a step number" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing"), "-o", str(tmp_path / "r.html")]) == 2
    error = capsys.readouterr().err
    assert "nothing to report at" in error and "no rule-output/*.json" in error
    assert not (tmp_path / "r.html").exists()


def test_cli_writes_the_default_file_name(plain_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(plain_run)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and '"tensor":"Net_fc1.weight"' in page  # its histograms


def test_an_unwritable_output_path_is_a_clear_error(plain_run: Path, tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["report", str(plain_run), "-o", str(blocker / "report.html")]) == 2
    assert f"-o {blocker / 'report.html'}: cannot write the report" in capsys.readouterr().err
