"""The uploader's status file (services/uploader/status.py), written by the real uploader against a
real S3 endpoint (moto server) and read back the way the control API reads it (read_host_file)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainguard.services.launchers.base import read_host_file
from trainguard.services.uploader.status import (
    STATUS_FILE_NAME,
    STATUS_MAX_BYTES,
    UploaderStatus,
    parse_status,
)

from tests.polling import wait_for
from tests.s3_server import free_port, s3_bucket, s3_client, s3_endpoint  # noqa: F401 - pytest fixtures
from trainguard.format.layout import END_OF_TRAINING

REPO = Path(__file__).resolve().parents[2]


def _uploader(source: Path, dest: str, endpoint: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "trainguard.services.uploader", "--source", str(source), "--dest", dest,
         "--endpoint-url", endpoint, "--poll-interval", "0.1", "--verify-interval", "0.5", *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def _status(path: Path) -> UploaderStatus | None:
    return parse_status(read_host_file(path, STATUS_MAX_BYTES))


def _run_dir(root: Path, files: int) -> Path:
    (root / "events").mkdir(parents=True)
    for step in range(files):
        (root / "events" / f"{step:012d}_worker_0.tfevents").write_bytes(b"x" * (100 + step))
    return root


def test_status_follows_the_uploader_until_it_is_done(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str  # noqa: F811 - pytest fixtures
) -> None:
    source = _run_dir(tmp_path / "run", 3)
    status_file = source / STATUS_FILE_NAME  # the default: beside the state file, in the source
    process = _uploader(source, f"s3://{s3_bucket}/run", s3_endpoint)
    try:
        following = wait_for(
            lambda: (s := _status(status_file)) is not None and s.counts.get("files") == 3 and s, 60, "three uploads"
        )
        assert following.state == "following" and following.ready and not following.finished
        assert following.error is None and following.passes >= 1 and following.last_pass_at is not None
        assert following.started_at <= following.last_pass_at <= time.time()
        (source / END_OF_TRAINING).write_bytes(b"")
        assert process.wait(60) == 0, process.stdout.read() if process.stdout else ""
    finally:
        process.kill()
    done = _status(status_file)
    assert done is not None and done.state == "done" and done.finished, done
    assert done.attempt == following.attempt
    assert done.counts["files"] == 4 and done.counts["bytes"] == 100 + 101 + 102
    keys = {o["Key"] for o in s3_client(s3_endpoint).list_objects_v2(Bucket=s3_bucket)["Contents"]}
    assert f"run/{END_OF_TRAINING}" in keys and f"run/{STATUS_FILE_NAME}" not in keys  # hidden: never uploaded


def test_told_to_finish_it_says_stopped_and_a_new_attempt_has_a_new_id(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str  # noqa: F811 - pytest fixtures
) -> None:
    source = _run_dir(tmp_path / "run", 2)
    status_file = tmp_path / "elsewhere" / "status.json"
    attempts: list[str] = []
    for _ in range(2):
        process = _uploader(source, f"s3://{s3_bucket}/run", s3_endpoint, "--drain", "0.2",
                            "--status-file", str(status_file))  # fmt: skip
        try:
            following = wait_for(
                lambda: (s := _status(status_file)) is not None and s.attempt not in attempts
                and s.state == "following" and s,
                60, "the uploader to follow",
            )  # fmt: skip
            process.send_signal(signal.SIGTERM)
            assert process.wait(60) == 0
        finally:
            process.kill()
        stopped = _status(status_file)
        assert stopped is not None and stopped.state == "stopped" and stopped.finished, stopped
        assert stopped.attempt == following.attempt not in attempts
        attempts.append(stopped.attempt)
    assert not (source / STATUS_FILE_NAME).exists()


def test_an_uploader_that_gives_up_says_failed_and_why(tmp_path: Path) -> None:
    source = _run_dir(tmp_path / "run", 1)
    process = _uploader(source, "s3://bucket/run", f"http://127.0.0.1:{free_port()}", "--give-up-after", "1")
    try:
        assert process.wait(60) == 1
    finally:
        process.kill()
    failed = _status(source / STATUS_FILE_NAME)
    assert failed is not None and failed.state == "failed" and not failed.finished, failed
    assert failed.error is not None and "S3 kept failing" in failed.error


def test_only_a_whole_document_of_this_version_is_a_status() -> None:
    status = UploaderStatus(attempt="a1", state="stopped", started_at=1.0, updated_at=2.0, passes=3,
                            counts={"files": 1})  # fmt: skip
    assert parse_status(status.to_json().encode()) == status
    whole = status.to_json()
    for raw in (b"", b"{", whole[: len(whole) // 2].encode(), b"[]",
                whole.replace('"version":1', '"version":2').encode(),
                whole.replace('"stopped"', '"sleeping"').encode(),
                b" " * (STATUS_MAX_BYTES + 1)):  # fmt: skip
        assert parse_status(raw) is None, raw
    assert parse_status(None) is None


def test_reading_a_status_file_follows_no_link_and_waits_on_no_fifo(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_bytes(b"{}")
    assert read_host_file(real, 10) == b"{}"
    assert read_host_file(real, 1) is None  # larger than asked for
    assert read_host_file(tmp_path / "missing", 10) is None
    (tmp_path / "link").symlink_to(real)
    assert read_host_file(tmp_path / "link", 10) is None
    os.mkfifo(tmp_path / "fifo")
    started = time.monotonic()
    assert read_host_file(tmp_path / "fifo", 10) is None
    assert time.monotonic() - started < 5
