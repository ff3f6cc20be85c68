"""A job's MetricDefinitions never freeze the API: RE2, a bounded log tail, a time budget, a cache.

``(a+)+$`` against a line of a's takes Python's backtracking ``re`` time exponential in the line
(15 s at 27 characters); the API runs metric regexes in RE2 instead, refuses at creation what RE2
cannot compile, and DescribeTrainingJob stays under a second with ``/health`` answering meanwhile.
The end-to-end test runs the real API (uvicorn, local launcher) with a job that prints 100 KB lines.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

import pytest

from tests.services.conftest import wait_for

re2 = pytest.importorskip("re2", reason="pip install google-re2")
from trainguard.services.api.job_metrics import (  # noqa: E402
    MetricScanner,
    final_metric_data,
    metric_regex_problem,
)

EVIL = r"(a+)+$"


def test_the_last_finite_value_of_each_definition_is_reported_in_definition_order() -> None:
    log = "\n".join(["loss=0.5 acc=0.1", "loss=nan", "acc=0.7", "loss=0.25 acc=x", "noise"])
    definitions = [{"Name": "acc", "Regex": r"acc=([0-9.]+)"}, {"Name": "loss", "Regex": r"loss=([0-9.na]+)"}]
    metrics = final_metric_data(definitions, log, 12.0)
    assert metrics == [
        {"MetricName": "acc", "Value": 0.7, "Timestamp": 12.0},
        {"MetricName": "loss", "Value": 0.25, "Timestamp": 12.0},
    ]
    assert final_metric_data([{"Name": "whole", "Regex": r"[0-9]+\.[0-9]+"}], "x 3.5 y", 1.0)[0]["Value"] == 3.5


def test_what_re2_cannot_run_is_named_and_what_it_can_is_accepted() -> None:
    for regex in (r"(a)\1", r"loss(?=:)", r"(?<!x)y", "(unclosed"):
        assert "RE2 cannot compile it" in metric_regex_problem(regex), regex
    for regex in (EVIL, r"loss: ([0-9\.]+)", r"(?P<v>\d+)", r"Train_Loss=(.*?);"):
        assert metric_regex_problem(regex) == "", regex
    # Describe skips a definition it cannot run rather than failing (creation refused it already).
    assert final_metric_data([{"Name": "x", "Regex": r"(a)\1"}, {"Name": "y", "Regex": "y=(1)"}], "y=1", 0.0) == [
        {"MetricName": "y", "Value": 1.0, "Timestamp": 0.0}
    ]


def test_catastrophic_patterns_over_long_lines_stay_within_the_budget() -> None:
    log = "\n".join(["a" * 100_000] * 10 + ["loss=0.25"])
    definitions = [{"Name": f"m{i}", "Regex": EVIL} for i in range(39)] + [{"Name": "loss", "Regex": "loss=(.+)"}]
    started = time.monotonic()
    metrics = final_metric_data(definitions, log, 0.0, budget_s=0.25)
    elapsed = time.monotonic() - started
    print(f"40 definitions over 10 x 100 KB lines: {elapsed * 1000:.0f} ms")
    assert elapsed < 1.0, elapsed
    assert metrics == [{"MetricName": "loss", "Value": 0.25, "Timestamp": 0.0}]


def test_a_megabyte_tail_with_forty_definitions_finds_early_and_late_values_within_the_budget() -> None:
    lines = [f"step {i} loss={i / 10:.1f} lr=0.01 " + "x" * 80 for i in range(10_000)]
    lines[3] = "epoch-metric acc=0.75"  # printed once, at the start of the tail
    definitions = [{"Name": f"never{i}", "Regex": rf"never{i}=([0-9.]+)"} for i in range(38)]
    definitions += [{"Name": "acc", "Regex": r"acc=([0-9.]+)"}, {"Name": "loss", "Regex": r"^step \d+ loss=(\S+)"}]
    started = time.monotonic()
    metrics = final_metric_data(definitions, "\n".join(lines), 0.0)
    elapsed = time.monotonic() - started
    print(f"40 definitions over {sum(map(len, lines)) // 1024} KiB: {elapsed * 1000:.0f} ms")
    assert {m["MetricName"]: m["Value"] for m in metrics} == {"acc": 0.75, "loss": 999.9}
    assert elapsed < 1.0


def test_nothing_matches_across_a_line_break_and_anchors_are_per_line() -> None:
    log = "loss:\n5\nloss: 7\nx=1\nx=2 trailing\r\nx=3\rx=4 trailing"
    assert final_metric_data([{"Name": "loss", "Regex": r"loss:\s*([0-9]+)"}], log, 0.0)[0]["Value"] == 7.0
    assert final_metric_data([{"Name": "x", "Regex": r"^x=([0-9])$"}], log, 0.0)[0]["Value"] == 3.0


def test_the_scanner_reads_a_bounded_tail_and_does_not_rescan_an_unchanged_log(monkeypatch) -> None:
    from trainguard.services.api import job_metrics

    scans: list[int] = []
    real_scan = job_metrics.final_metric_data

    def counting_scan(definitions, text, timestamp, **options):  # noqa: ANN001, ANN202
        scans.append(len(text))
        return real_scan(definitions, text, timestamp, **options)

    monkeypatch.setattr(job_metrics, "final_metric_data", counting_scan)
    log = {"text": "a\n" * 1000 + "loss=1.5\n"}
    reads: list[int] = []

    def read_log(tail: int) -> str:
        reads.append(tail)
        return log["text"]

    scanner = MetricScanner(max_lines=50, max_chars=1000, refresh_s=0)
    definitions = [{"Name": "loss", "Regex": r"loss=([0-9.]+)"}]

    def describe(finished: bool = False) -> list[dict]:
        return scanner.final_metric_data("job", 1.0, definitions, 5.0, finished=finished, read_log=read_log)

    assert describe() == [{"MetricName": "loss", "Value": 1.5, "Timestamp": 5.0}]
    assert reads == [50] and scans == [1000]  # the tail asked for, cut to max_chars
    describe()
    assert scans == [1000], "an unchanged log was scanned again"
    log["text"] += "loss=2.5\n"
    assert describe()[0]["Value"] == 2.5 and len(scans) == 2
    describe(finished=True)
    reads.clear()
    assert describe(finished=True)[0]["Value"] == 2.5
    assert reads == [] and len(scans) == 2, "a finished job's log was read again"
    # A running job's log is read again only after refresh_s.
    polled = MetricScanner(refresh_s=60)
    assert polled.final_metric_data("job", 1.0, definitions, 5.0, finished=False, read_log=read_log)
    log["text"] += "loss=3.5\n"
    reads.clear()
    again = polled.final_metric_data("job", 1.0, definitions, 6.0, finished=False, read_log=read_log)
    assert reads == [] and again == [{"MetricName": "loss", "Value": 2.5, "Timestamp": 6.0}]


# -- the real API ---------------------------------------------------------------------------------------
_LONG_LINES = (
    "import time\n"
    "for _ in range(10): print('a' * 100000, flush=True)\n"
    "print('loss=0.25', flush=True)\n"
    "time.sleep(120)\n"
)


def _request(name: str, definitions: list[dict]) -> dict:
    return {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::111122223333:role/R",
        "OutputDataConfig": {"S3OutputPath": "s3://bkt/"},
        "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        "AlgorithmSpecification": {"TrainingImage": "trainguard-training:local", "TrainingInputMode": "File",
                                   "ContainerEntrypoint": [sys.executable],
                                   "ContainerArguments": ["-c", _LONG_LINES],
                                   "MetricDefinitions": definitions},
    }  # fmt: skip


def _timed(call) -> float:  # noqa: ANN001
    started = time.monotonic()
    call()
    return time.monotonic() - started


@pytest.mark.timeout(240)
def test_describe_with_catastrophic_metric_regexes_is_fast_and_health_answers_meanwhile(api) -> None:
    from botocore.exceptions import ClientError

    client = api.sagemaker()
    with pytest.raises(ClientError) as refused:
        client.create_training_job(**_request("backref-job", [{"Name": "x", "Regex": r"(a)\1"}]))
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert "MetricDefinitions[0].Regex" in refused.value.response["Error"]["Message"]

    name = "evil-metrics"
    definitions = [{"Name": f"m{i}", "Regex": EVIL} for i in range(39)] + [{"Name": "loss", "Regex": r"loss=(\S+)"}]
    client.create_training_job(**_request(name, definitions))

    def printed() -> bool:
        status, text = api.request("GET", f"/v1/jobs/{name}/logs?component=training")
        assert api.job(name)["status"] == "InProgress", api.job(name)
        return status == 200 and "loss=0.25" in str(text)

    wait_for(printed, 90, "the job to print its long lines")
    baseline = [_timed(lambda: api.request("GET", "/health", auth=False)) for _ in range(20)]
    describes: list[float] = []
    health: list[float] = []
    stop = threading.Event()

    def probe_health() -> None:
        while not stop.is_set():
            health.append(_timed(lambda: api.request("GET", "/health", auth=False)))
            time.sleep(0.02)

    prober = threading.Thread(target=probe_health)
    prober.start()
    try:
        first = None
        for _ in range(10):
            started = time.monotonic()
            description = client.describe_training_job(TrainingJobName=name)
            describes.append(time.monotonic() - started)
            first = first or description
    finally:
        stop.set()
        prober.join()
        client.stop_training_job(TrainingJobName=name)
    print(
        f"describe: first {describes[0] * 1000:.0f} ms, max {max(describes) * 1000:.0f} ms, "
        f"median {statistics.median(describes) * 1000:.0f} ms; /health during them: n={len(health)}, "
        f"max {max(health) * 1000:.1f} ms, median {statistics.median(health) * 1000:.1f} ms; /health before them: "
        f"max {max(baseline) * 1000:.1f} ms, median {statistics.median(baseline) * 1000:.1f} ms"
    )
    assert first["FinalMetricDataList"][0]["MetricName"] == "loss", first.get("FinalMetricDataList")
    assert first["FinalMetricDataList"][0]["Value"] == 0.25
    assert max(describes) < 1.0, describes
    # The goal is < 100 ms; the slack is for a loaded shared machine (the figures are printed, and
    # before the fix one describe blocked /health for 15 s).
    assert max(health) < 0.5, health
