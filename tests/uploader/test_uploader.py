"""The uploader against a real S3 endpoint (moto server) while a real PyTorch training run writes.

Checks what the uploader promises: every file ends up on S3 byte for byte, a reader listing S3
never sees an index before its event file or the end marker before the rest, and a kill -9 of the
uploader mid-run followed by a restart neither loses a file nor PUTs one twice (counted by a proxy).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.s3_server import s3_bucket, s3_client, s3_endpoint  # noqa: F401 - pytest fixtures
from tests.uploader.counting_proxy import CountingProxy
from trainguard.format.layout import END_OF_TRAINING, parse_index_key

REPO = Path(__file__).resolve().parents[2]
TRAIN = Path(__file__).with_name("_train.py")


def _local_files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    }


def _s3_files(endpoint: str, bucket: str, prefix: str) -> dict[str, bytes]:
    client = s3_client(endpoint)
    keys = [
        obj["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
        for obj in page.get("Contents", [])
    ]
    return {k[len(prefix) + 1 :]: client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def _start_training(out_dir: Path, steps: int, step_sleep: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(TRAIN), str(out_dir), "--steps", str(steps), "--step-sleep", str(step_sleep)],
        cwd=REPO,
    )


def _start_uploader(source: Path, dest: str, endpoint: str, state: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "trainguard.services.uploader", "--source", str(source), "--dest", dest,
         "--endpoint-url", endpoint, "--state-file", str(state), "--poll-interval", "0.1", *extra],
        cwd=REPO, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )


class _OrderWatcher(threading.Thread):
    """Lists S3 over and over during the run, recording any view a reader must never get."""

    def __init__(self, endpoint: str, bucket: str, prefix: str) -> None:
        super().__init__(daemon=True)
        self.args = (endpoint, bucket, prefix)
        self.violations: list[str] = []
        self.listings = 0
        self.stop = threading.Event()

    def run(self) -> None:
        endpoint, bucket, prefix = self.args
        client = s3_client(endpoint)
        while not self.stop.is_set():
            response = client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
            keys = {obj["Key"][len(prefix) + 1 :] for obj in response.get("Contents", [])}
            self.listings += 1
            for key in keys:
                parsed = parse_index_key(key)
                if parsed is not None:
                    event = f"events/{parsed.step:012d}/{parsed.step:012d}_{parsed.worker}.tfevents"
                    if event not in keys:
                        self.violations.append(f"index {key} visible before {event}")
            if END_OF_TRAINING in keys and any(parse_index_key(k) is None and k.startswith("index/") for k in keys):
                self.violations.append("end marker visible with a partial index")
            time.sleep(0.02)


def test_follows_a_live_training_run(s3_endpoint, s3_bucket, tmp_path):  # noqa: ANN001, F811
    source = tmp_path / "run"
    prefix = "jobs/live/tensors"
    watcher = _OrderWatcher(s3_endpoint, s3_bucket, prefix)
    watcher.start()
    training = _start_training(source, steps=40, step_sleep=0.05)
    uploader = _start_uploader(source, f"s3://{s3_bucket}/{prefix}", s3_endpoint, tmp_path / "state.json")
    try:
        assert training.wait(timeout=120) == 0
        out, _ = uploader.communicate(timeout=60)
    finally:
        watcher.stop.set()
        training.kill()
        uploader.kill()
    watcher.join()
    assert uploader.returncode == 0, out
    summary = json.loads(out.strip().splitlines()[-1])
    local = _local_files(source)
    assert len(local) == 40 * 2 + 2  # events + indexes per step, collections, end marker
    assert _s3_files(s3_endpoint, s3_bucket, prefix) == local
    assert summary["uploader"] == "done" and summary["files"] >= len(local)
    assert watcher.listings > 5 and watcher.violations == []

    # Started again on a finished run, it has nothing to do and exits 0 at once.
    again = _start_uploader(source, f"s3://{s3_bucket}/{prefix}", s3_endpoint, tmp_path / "state.json")
    out, _ = again.communicate(timeout=30)
    assert again.returncode == 0 and json.loads(out.strip().splitlines()[-1])["puts"] == 0


def test_under_trainguard_run_the_exit_record_goes_up_before_the_end_marker(s3_endpoint, s3_bucket, tmp_path):  # noqa: ANN001, F811
    # `trainguard run` says how its command ended after the hook's end marker (written at the
    # hook's close, here 3 s before the process exits): the S3 copy must hold that record too.
    source = tmp_path / "run"
    prefix = "jobs/exit-record/tensors"
    training = subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli", "run", "--out", str(source), "--",
         sys.executable, str(TRAIN), str(source), "--steps", "5", "--step-sleep", "0.01", "--linger", "3"],
        cwd=REPO,
    )  # fmt: skip
    uploader = _start_uploader(source, f"s3://{s3_bucket}/{prefix}", s3_endpoint, tmp_path / "state.json")
    try:
        deadline = time.monotonic() + 120
        while not (source / END_OF_TRAINING).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (source / END_OF_TRAINING).exists()
        time.sleep(1.0)
        assert uploader.poll() is None, "the uploader ended while the command was still running"
        assert training.wait(timeout=60) == 0
        out, _ = uploader.communicate(timeout=60)
    finally:
        training.kill()
        uploader.kill()
    assert uploader.returncode == 0, out
    on_s3 = _s3_files(s3_endpoint, s3_bucket, prefix)
    assert on_s3 == _local_files(source)
    assert json.loads(on_s3["trainguard-exit.json"])["returncode"] == 0


def test_kill_9_mid_run_then_restart_loses_nothing_and_puts_each_file_once(s3_endpoint, s3_bucket, tmp_path):  # noqa: ANN001, F811
    source = tmp_path / "run"
    prefix = "jobs/killed/tensors"
    state = tmp_path / "state.json"
    with CountingProxy(s3_endpoint) as proxy:
        training = _start_training(source, steps=60, step_sleep=0.05)
        uploader = _start_uploader(source, f"s3://{s3_bucket}/{prefix}", proxy.endpoint, state)
        try:
            deadline = time.monotonic() + 60
            while len(proxy.puts) < 20:  # well into the run
                assert time.monotonic() < deadline, "the uploader uploaded nothing"
                time.sleep(0.02)
            uploader.send_signal(signal.SIGKILL)
            uploader.wait(timeout=10)
            assert training.poll() is None, "training ended before the kill: make the run longer"
            uploaded_before_kill = sum(proxy.puts.values())
            restarted = _start_uploader(source, f"s3://{s3_bucket}/{prefix}", proxy.endpoint, state)
            assert training.wait(timeout=120) == 0
            out, _ = restarted.communicate(timeout=60)
        finally:
            training.kill()
            uploader.kill()
        assert restarted.returncode == 0, out

    local = _local_files(source)
    assert _s3_files(s3_endpoint, s3_bucket, prefix) == local  # nothing lost, bytes identical
    object_puts = {k: n for k, n in proxy.puts.items() if k.startswith(f"/{s3_bucket}/{prefix}/")}
    assert len(object_puts) == len(local)
    # Each file went up exactly once across both runs; only the collections file may go up again,
    # because the hook rewrites it in place.
    repeated = {k: n for k, n in object_puts.items() if n > 1 and "/collections/" not in k}
    assert repeated == {}
    assert 20 <= uploaded_before_kill < sum(object_puts.values())


def test_sigterm_keeps_following_until_the_end_marker_within_the_drain(s3_endpoint, s3_bucket, tmp_path):  # noqa: ANN001, F811
    """A job being stopped: the uploader gets SIGTERM while training writes its last steps."""
    source = tmp_path / "run"
    prefix = "jobs/drained/tensors"
    training = _start_training(source, steps=40, step_sleep=0.05)
    uploader = _start_uploader(source, f"s3://{s3_bucket}/{prefix}", s3_endpoint, tmp_path / "state.json",
                               "--drain", "60")  # fmt: skip
    try:
        wait_until = time.monotonic() + 60
        while not (source / "index").exists():
            assert time.monotonic() < wait_until, "training wrote nothing"
            time.sleep(0.05)
        uploader.send_signal(signal.SIGTERM)
        assert training.wait(timeout=120) == 0
        out, _ = uploader.communicate(timeout=90)
    finally:
        training.kill()
        uploader.kill()
    assert uploader.returncode == 0, out
    # The end marker arrived within the drain, so it finished normally, with everything up.
    assert json.loads(out.strip().splitlines()[-1])["uploader"] == "stopped"
    assert _s3_files(s3_endpoint, s3_bucket, prefix) == _local_files(source)


def test_bad_destination_is_a_clear_error(tmp_path):  # noqa: ANN001
    result = subprocess.run(
        [sys.executable, "-m", "trainguard.services.uploader", "--source", str(tmp_path), "--dest", "bucket/prefix"],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 2
    assert "s3://bucket/prefix" in result.stderr and "'bucket/prefix'" in result.stderr


@pytest.mark.parametrize("missing", ["--source", "--dest"])
def test_required_arguments(tmp_path, missing):  # noqa: ANN001
    arguments = {"--source": str(tmp_path), "--dest": "s3://bucket/x"}
    arguments.pop(missing)
    env = {k: v for k, v in os.environ.items() if k not in ("UPLOADER_SOURCE", "UPLOADER_DEST")}
    result = subprocess.run(
        [sys.executable, "-m", "trainguard.services.uploader", *[x for kv in arguments.items() for x in kv]],
        cwd=REPO, capture_output=True, text=True, timeout=30, env=env,
    )
    assert result.returncode == 2 and missing in result.stderr
