"""The rule runner under S3 faults: the endpoint restarted empty while a rule reads the run.

Found by bench/chaos_stack.py (restart-s3-empty on the compose stack): a rule reading a step while
S3 was down got a StorageError, was "isolated" like a rule that raised, and ended Error after 1 of
200 steps, although the uploader had every file back on S3 seconds later. A store failure while
evaluating is now retried like a failed poll. Real moto server in its own process; the run is
written with the hook's writer and uploaded the way the uploader does (end marker last).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.reliability.faults import RestartableS3
from tests.rules.synthetic import write_run
from tests.rules.test_runner import _lines, _spec, _values
from tests.s3_server import DUMMY_CREDENTIALS
from trainguard.rules import RuleStatus
from trainguard.rules.runner import RuleRunner


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    for name, value in DUMMY_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    # The read cache is keyed by the run's URL: an earlier test's run at the same URL must not answer.
    monkeypatch.setenv("TRAINGUARD_CACHE_DIR", str(tmp_path / "cache"))
    server = RestartableS3(tmp_path / "moto.log")
    server.start()
    yield server
    server.kill()


def _upload(s3: RestartableS3, local: Path, prefix: str) -> None:
    client = s3.client()
    client.create_bucket(Bucket="runs")
    files = sorted(p for p in local.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == "training_job_end.ts")  # the end marker last, as the uploader
    for file in files:
        client.upload_file(str(file), "runs", f"{prefix}/{file.relative_to(local).as_posix()}")


def test_rule_reading_while_s3_restarts_empty_retries_and_evaluates_every_step(s3: RestartableS3,
                                                                                tmp_path: Path) -> None:  # fmt: skip
    local = Path(write_run(tmp_path / "run", _values(set(), range(8))))
    _upload(s3, local, "job/debug-output")
    log = tmp_path / "log"
    runner = RuleRunner("s3://runs/job/debug-output", [_spec("ValueAbove", "r", log=log, delay=0.5)],
                        endpoint_url=s3.endpoint, poll_interval=0.1, output_dir=str(tmp_path / "out"))  # fmt: skip
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(runner.run()))
    thread.start()
    deadline = time.monotonic() + 60
    while "check 3" not in _lines(log) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "check 3" in _lines(log) and thread.is_alive()
    # The rule sleeps 0.5 s after logging a step and before reading it: step 3 is read while S3 is
    # down or empty, whatever the load on this machine.
    s3.restart_empty(down_s=1.0)  # the steps after 3 are gone, the bucket with them
    time.sleep(2.0)  # the rule keeps reading a store that has nothing
    assert thread.is_alive(), "a store failure must not end the rule"
    _upload(s3, local, "job/debug-output")  # what the uploader's verification does: send it all again
    thread.join(timeout=120)
    assert not thread.is_alive()
    final = result["r"]
    assert final.status == RuleStatus.NO_ISSUES_FOUND, final.status_details
    assert final.last_evaluated_step == 7
    checks = sorted({int(line.split()[1]) for line in _lines(log) if line.startswith("check")})
    assert checks == list(range(8)), "every step evaluated once the files are back"
