"""Real faults for the reliability suite and bench/chaos.py: an S3 endpoint (moto server) that can be
killed and restarted empty on the same port, and helpers that compare a run directory with S3.

Nothing here mocks a component: the S3 server is moto's HTTP server in its own process, and a
"restart empty" is what an S3 endpoint without persistence does when it restarts; a full training
disk is a real tmpfs of a few MiB filled to its last byte.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.s3_server import DUMMY_CREDENTIALS, free_port

__all__ = [
    "RestartableS3", "fill_disk", "local_run_files", "mount_small_disk", "s3_run_files", "unmount", "uploader_command",
    "wait_for_capture",
]  # fmt: skip

REPO = Path(__file__).resolve().parents[2]


class RestartableS3:
    """A moto server on a fixed port: :meth:`restart_empty` kills it (SIGKILL) and starts a fresh one."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        environment = {**os.environ, **DUMMY_CREDENTIALS, "NO_PROXY": "127.0.0.1,localhost"}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, env=environment,
            )  # fmt: skip
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.process.returncode}")
            try:
                with opener.open(f"{self.endpoint}/moto-api/data.json", timeout=1):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not answer on {self.endpoint}") from None
                time.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        self.process = None

    def restart_empty(self, down_s: float = 0.0) -> None:
        self.kill()
        time.sleep(down_s)
        self.start()

    def client(self):  # noqa: ANN201 - a botocore S3 client
        import boto3
        from botocore.config import Config

        return boto3.session.Session(
            aws_access_key_id=DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=DUMMY_CREDENTIALS["AWS_DEFAULT_REGION"],
        ).client("s3", endpoint_url=self.endpoint, config=Config(retries={"max_attempts": 1}))


def local_run_files(root: Path) -> dict[str, int]:
    """What a run directory holds (hidden temp/state files aside): key -> size."""
    return {
        p.relative_to(root).as_posix(): p.stat().st_size
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    }


def wait_for_capture(root: Path, files: int = 10, timeout: float = 300.0) -> None:
    """Wait until training has written ``files`` files of its run in ``root``. A job starts PyTorch
    at the jobs' niceness: on a loaded machine (load 20-30 on 2 cores) its first step came 60-95 s
    after the job was created, which a test of the uploader must not count as upload latency."""
    from tests.polling import wait_for

    wait_for(lambda: root.is_dir() and len(local_run_files(root)) >= files, timeout, f"training to write {files} files")


def s3_run_files(client, bucket: str, prefix: str) -> dict[str, int]:  # noqa: ANN001
    """What S3 holds under ``prefix``: key relative to it -> size ({} when the bucket is gone)."""
    import botocore.exceptions

    found: dict[str, int] = {}
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
            for entry in page.get("Contents", []):
                found[entry["Key"][len(prefix) + 1 :]] = entry["Size"]
    except (botocore.exceptions.ClientError, botocore.exceptions.EndpointConnectionError):
        return {}
    return found


def uploader_command(source: Path, dest: str, endpoint: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "trainguard.services.uploader", "--source", str(source), "--dest", dest,
        "--endpoint-url", endpoint, "--poll-interval", "0.1", "--verify-interval", "0.5", *extra,
    ]  # fmt: skip


DISK_MIB = 8  # room for the whole run (600 files of one 4 KiB page each); the ballast fills the rest


def mount_small_disk(directory: Path, mib: int = DISK_MIB) -> None:
    """A tmpfs of ``mib`` MiB on ``directory``: a training disk that can fill up. Raises OSError when
    it cannot be mounted (not root, no mount permission in this container)."""
    directory.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(directory)],
                            capture_output=True, text=True)  # fmt: skip
    if result.returncode != 0:
        raise OSError(f"cannot mount a tmpfs on {directory}: {result.stderr.strip() or result.returncode}")


def unmount(directory: Path) -> None:
    subprocess.run(["umount", "-l", str(directory)], capture_output=True)


def fill_disk(directory: Path) -> int:
    """Write a hidden ballast file (the uploader and the file counts skip dot files) until the
    filesystem says ENOSPC; the file stays, so the disk stays full. Returns the bytes written."""
    written = 0
    chunk = b"\0" * (64 << 10)
    with open(directory / ".ballast", "wb", buffering=0) as ballast:
        try:
            while True:
                written += ballast.write(chunk)
        except OSError as error:
            if error.errno != 28:  # ENOSPC is the point; anything else is a broken fault
                raise
    # Fill the last partial chunk too: a filesystem rounding to pages may still hold a few KiB.
    with open(directory / ".ballast2", "wb", buffering=0) as ballast:
        try:
            while True:
                written += ballast.write(b"\0" * 512)
        except OSError as error:
            if error.errno != 28:
                raise
    return written
