"""The compose stack's S3 endpoint (containers/rules/s3_endpoint.py) as a real server process on
this machine, on a data directory the test chooses (a small tmpfs, so it can fill up)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.s3_server import DUMMY_CREDENTIALS, free_port

__all__ = ["ENDPOINT_SCRIPT", "StackS3Endpoint", "fill_bucket"]

REPO = Path(__file__).resolve().parents[2]
ENDPOINT_SCRIPT = REPO / "containers" / "rules" / "s3_endpoint.py"


class StackS3Endpoint:
    """Started on construction (raises AssertionError with the log when it does not answer)."""

    def __init__(self, data_dir: Path, log_path: Path, *extra: str) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        environment = {**os.environ, **DUMMY_CREDENTIALS, "NO_PROXY": "127.0.0.1,localhost"}
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(ENDPOINT_SCRIPT), "--host", "127.0.0.1", "--port", str(self.port),
                 "--data-dir", str(data_dir), *extra],
                stdout=log, stderr=subprocess.STDOUT, env=environment,
            )  # fmt: skip
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + 30
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"the S3 endpoint exited:\n{log_path.read_text()[-3000:]}")
            try:
                with opener.open(f"{self.url}/moto-api/", timeout=1):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"the S3 endpoint did not answer:\n{log_path.read_text()[-3000:]}") from None
                time.sleep(0.05)

    def client(self):  # noqa: ANN201 - a botocore S3 client
        import boto3
        from botocore.config import Config

        return boto3.session.Session(
            aws_access_key_id=DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=DUMMY_CREDENTIALS["AWS_DEFAULT_REGION"],
        ).client("s3", endpoint_url=self.url, config=Config(retries={"max_attempts": 1}))

    def used_bytes(self) -> int:
        stat = os.statvfs(self.data_dir)
        return (stat.f_blocks - stat.f_bfree) * stat.f_frsize

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def fill_bucket(client, bucket: str, prefix: str = "ballast/") -> list[str]:  # noqa: ANN001
    """PUT ballast objects (1 MiB, then 4 KiB) until the endpoint answers StorageFull; their keys."""
    import botocore.exceptions

    keys: list[str] = []
    for size in (1 << 20, 4096):
        while True:
            key = f"{prefix}{len(keys)}"
            try:
                client.put_object(Bucket=bucket, Key=key, Body=b"\0" * size)
            except botocore.exceptions.ClientError as error:
                if error.response["Error"]["Code"] != "StorageFull":
                    raise
                break
            keys.append(key)
    return keys
