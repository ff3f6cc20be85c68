"""The uploader under S3 faults: an endpoint restarted empty mid-run, an endpoint gone for good, and
a run that captured nothing. A real PyTorch training run writes while a real uploader process
follows it into a real (moto) S3 server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.polling import wait_for
from tests.reliability.faults import REPO, RestartableS3, local_run_files, s3_run_files, uploader_command
from tests.s3_server import DUMMY_CREDENTIALS
from trainguard.format.layout import END_OF_TRAINING

TRAIN = REPO / "tests" / "uploader" / "_train.py"


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for name, value in DUMMY_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = RestartableS3(tmp_path / "moto.log")
    server.start()
    yield server
    server.kill()


def _uploader(source: Path, dest: str, endpoint: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        uploader_command(source, dest, endpoint, *extra), cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def test_endpoint_restarted_empty_mid_run_loses_nothing(s3: RestartableS3, tmp_path: Path) -> None:
    s3.client().create_bucket(Bucket="runs")
    run = tmp_path / "run"
    training = subprocess.Popen([sys.executable, str(TRAIN), str(run), "--steps", "60", "--step-sleep", "0.08"], cwd=REPO)
    uploader = _uploader(run, "s3://runs/job/debug-output", s3.endpoint)
    try:
        wait_for(lambda: len(s3_run_files(s3.client(), "runs", "job/debug-output")) >= 15, 60, "15 files on S3")
        s3.client().create_bucket(Bucket="sentinel")
        s3.restart_empty(down_s=0.5)  # everything sent so far is gone, the bucket with it
        # The server came back empty (a bucket nobody re-creates is gone). Not checked on "runs":
        # the uploader may already have re-created it and re-sent files by the time we look.
        assert "sentinel" not in {bucket["Name"] for bucket in s3.client().list_buckets()["Buckets"]}
        assert training.wait(timeout=120) == 0
        out, err = uploader.communicate(timeout=120)
    finally:
        training.kill()
        uploader.kill()
    assert uploader.returncode == 0, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    local = local_run_files(run)
    on_s3 = s3_run_files(s3.client(), "runs", "job/debug-output")
    assert len(local) > 30 and END_OF_TRAINING in local
    assert on_s3 == local, f"missing on S3: {sorted(set(local) - set(on_s3))}"
    assert summary["resent"] >= 15  # what the restart wiped was found missing and sent again


def test_run_that_captured_nothing_still_gets_its_end_marker(s3: RestartableS3, tmp_path: Path) -> None:
    """Training wrote nothing (no hook); when told training is over (SIGTERM) the uploader ends the run."""
    s3.client().create_bucket(Bucket="runs")
    uploader = _uploader(tmp_path / "never-created", "s3://runs/empty/debug-output", s3.endpoint, "--drain", "0.5")
    time.sleep(1.5)
    assert uploader.poll() is None  # nothing captured, no end marker: it keeps following
    uploader.send_signal(signal.SIGTERM)
    out, err = uploader.communicate(timeout=60)
    assert uploader.returncode == 0, err[-2000:]
    assert s3_run_files(s3.client(), "runs", "empty/debug-output") == {END_OF_TRAINING: 0}


def test_endpoint_gone_for_good_fails_naming_the_missing_files(s3: RestartableS3, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert subprocess.run([sys.executable, str(TRAIN), str(run), "--steps", "3", "--step-sleep", "0"], cwd=REPO).returncode == 0
    s3.kill()
    uploader = _uploader(run, "s3://runs/lost/debug-output", s3.endpoint, "--give-up-after", "2")
    out, err = uploader.communicate(timeout=120)
    assert uploader.returncode == 1
    last = err.strip().splitlines()[-1]
    assert "not on S3" in last and "events/" in last, last
    assert json.loads(out.strip().splitlines()[-1])["uploader"] == "failed"


@pytest.fixture
def full_s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The stack's S3 endpoint on an 8 MiB disk, filled with ballast until it answers StorageFull."""
    from tests.e2e.s3_endpoint_process import StackS3Endpoint, fill_bucket
    from tests.reliability.faults import mount_small_disk, unmount

    for name, value in DUMMY_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    disk = tmp_path / "s3-data"
    try:
        mount_small_disk(disk, 8)
    except OSError as error:
        pytest.skip(f"needs a tmpfs for the S3 endpoint's data (root): {error}")
    endpoint = None
    try:
        endpoint = StackS3Endpoint(disk, tmp_path / "s3.log", "--min-free-mb", "0")
        endpoint.client().create_bucket(Bucket="runs")
        endpoint.ballast = fill_bucket(endpoint.client(), "runs")
        yield endpoint
    finally:
        if endpoint is not None:
            endpoint.stop()
        unmount(disk)


def _finished_run(run: Path) -> None:
    command = [sys.executable, str(TRAIN), str(run), "--steps", "5", "--step-sleep", "0"]
    assert subprocess.run(command, cwd=REPO).returncode == 0


def test_full_s3_is_reported_as_full_retried_and_resumed_once_there_is_room(full_s3, tmp_path: Path) -> None:  # noqa: ANN001
    run = tmp_path / "run"
    _finished_run(run)
    stderr_path = tmp_path / "uploader.err"
    with open(stderr_path, "w") as stderr:
        uploader = subprocess.Popen(
            uploader_command(run, "s3://runs/full/debug-output", full_s3.url, "--give-up-after", "120"),
            cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=stderr,
        )  # fmt: skip
    try:
        wait_for(lambda: "S3 is full" in stderr_path.read_text(), 60, "the uploader to say S3 is full")
        assert uploader.poll() is None  # still retrying, not failed
        for key in full_s3.ballast:  # the operator makes room
            full_s3.client().delete_object(Bucket="runs", Key=key)
        out, _ = uploader.communicate(timeout=120)
    finally:
        uploader.kill()
    assert uploader.returncode == 0, stderr_path.read_text()[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["uploader"] == "done" and summary["full_refusals"] >= 1, summary
    assert s3_run_files(full_s3.client(), "runs", "full/debug-output") == local_run_files(run)


def test_s3_full_past_the_give_up_time_fails_saying_so_and_naming_the_files(full_s3, tmp_path: Path) -> None:  # noqa: ANN001
    run = tmp_path / "run"
    _finished_run(run)
    uploader = _uploader(run, "s3://runs/stuck/debug-output", full_s3.url, "--give-up-after", "3")
    out, err = uploader.communicate(timeout=120)
    assert uploader.returncode == 1, err[-2000:]
    last = err.strip().splitlines()[-1]
    # The control API quotes this line as the job's failure reason.
    assert "S3 is full" in last and "StorageFull" in last and "not on S3" in last, last
    assert json.loads(out.strip().splitlines()[-1])["full_refusals"] >= 1


def test_a_multipart_upload_refused_by_a_full_s3_is_retried_and_named(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """Files from 64 MiB go up in parts (boto3's upload_file), whose failure arrives wrapped in
    S3UploadFailedError: still an S3 failure to retry, and still "S3 is full"."""
    from tests.e2e.s3_endpoint_process import StackS3Endpoint
    from tests.reliability.faults import mount_small_disk, unmount

    for name, value in DUMMY_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    disk = tmp_path / "s3-data"
    try:
        mount_small_disk(disk, 96)
    except OSError as error:
        pytest.skip(f"needs a tmpfs for the S3 endpoint's data (root): {error}")
    endpoint = None
    try:
        # 96 MiB with a 64 MiB reserve: a few parts fit, the 70 MiB file does not.
        endpoint = StackS3Endpoint(disk, tmp_path / "s3.log", "--min-free-mb", "64")
        endpoint.client().create_bucket(Bucket="runs")
        run = tmp_path / "run"
        (run / "tensorboard").mkdir(parents=True)
        (run / "tensorboard" / "big.bin").write_bytes(os.urandom(70 << 20))
        (run / END_OF_TRAINING).write_bytes(b"")
        uploader = _uploader(run, "s3://runs/big/debug-output", endpoint.url, "--give-up-after", "3")
        out, err = uploader.communicate(timeout=180)
    finally:
        if endpoint is not None:
            endpoint.stop()
        unmount(disk)
    assert uploader.returncode == 1, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert "S3 is full" in last and "tensorboard/big.bin" in last, last
    assert json.loads(out.strip().splitlines()[-1])["full_refusals"] >= 1
