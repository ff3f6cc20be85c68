"""``trainguard serve`` as an operator runs it: a real process, its embedded S3 child, real signals.

What it prints must work (the generated key pair is accepted; a configured keys file replaces it,
and then no pair is printed that would be refused), its embedded S3 endpoint dies with it however
it dies (SIGTERM, kill -9), its log is private, and where local jobs cannot be isolated it says so
and refuses a second tenant unless the operator opts in.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.polling import wait_for
from tests.s3_server import free_port
from tests.services.job_users import needs_root, traversable_for_jobs

pytest.importorskip("moto")
pytest.importorskip("boto3")

_KEY_EXPORT = re.compile(r"export AWS_ACCESS_KEY_ID=(\S+) AWS_SECRET_ACCESS_KEY=(\S+)")


class Serve:
    """One ``python -m trainguard.cli serve`` process and what it printed."""

    def __init__(self, tmp_path: Path, extra_env: dict[str, str] | None = None, *, embedded_s3: bool = True) -> None:
        self.port = free_port()
        self.data_dir = tmp_path / "state"
        self.log_path = tmp_path / f"serve-{self.port}.log"
        environment = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINGUARD_", "AWS_", "S3_"))}
        environment.update({"HOME": str(tmp_path), "NO_PROXY": "127.0.0.1,localhost", **(extra_env or {})})
        command = [sys.executable, "-m", "trainguard.cli", "serve", "--port", str(self.port),
                   "--data-dir", str(self.data_dir)]  # fmt: skip
        if not embedded_s3:
            command.append("--no-embedded-s3")
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            command, cwd=tmp_path, env=environment, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def output(self) -> str:
        return self.log_path.read_text()

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1).close()
                return
            except OSError:
                assert self.process.poll() is None, self.output
                assert time.monotonic() < deadline, self.output
                time.sleep(0.3)

    def embedded_s3(self) -> tuple[int, int]:
        """(pid, port) of the moto server child."""
        for status in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = status.read_text().rpartition(")")[2].split()
                if int(fields[1]) != self.process.pid:
                    continue
                argv = (status.parent / "cmdline").read_bytes().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
            if b"moto.server" in argv:
                return int(status.parent.name), int(argv[argv.index(b"-p") + 1])
        raise AssertionError(f"serve {self.process.pid} has no moto.server child\n{self.output}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=20)
        self._log.close()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:
    started: list[Serve] = []

    def start(extra_env: dict[str, str] | None = None, *, embedded_s3: bool = True) -> Serve:
        server = Serve(tmp_path, extra_env, embedded_s3=embedded_s3)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _sagemaker(port: int, key_id: str, secret: str):  # noqa: ANN202 - a botocore client
    import boto3

    session = boto3.session.Session(aws_access_key_id=key_id, aws_secret_access_key=secret, region_name="us-east-1")
    return session.client("sagemaker", endpoint_url=f"http://127.0.0.1:{port}")


def test_the_printed_key_pair_is_accepted(serve) -> None:  # noqa: ANN001
    server = serve(embedded_s3=False)
    server.wait_healthy()
    printed = _KEY_EXPORT.findall(server.output)
    assert len(printed) == 1, server.output
    key_id, secret = printed[0]
    assert _sagemaker(server.port, key_id, secret).list_training_jobs()["TrainingJobSummaries"] == []


def test_with_a_keys_file_no_refused_pair_is_printed(serve, tmp_path: Path) -> None:  # noqa: ANN001
    from botocore.exceptions import ClientError

    keys_file = tmp_path / "keys"
    keys_file.write_text("alice=AKIATGALICE000000001:alice-secret-0123456789abcdef\n")
    keys_file.chmod(0o600)
    server = serve({"TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE": str(keys_file)}, embedded_s3=False)
    server.wait_healthy()
    assert _KEY_EXPORT.findall(server.output) == [], server.output  # every printed pair would be refused
    assert str(keys_file) in server.output
    assert _sagemaker(server.port, "AKIATGALICE000000001", "alice-secret-0123456789abcdef").list_training_jobs()
    import json

    generated = json.loads((server.data_dir / "credentials.json").read_text())
    with pytest.raises(ClientError):  # the generated pair is not a key of this endpoint: it was not offered
        _sagemaker(server.port, generated["sagemaker_access_key_id"], generated["sagemaker_secret_access_key"]
                   ).list_training_jobs()  # fmt: skip


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "kill-9"])
def test_the_embedded_s3_endpoint_dies_with_serve(serve, how: signal.Signals) -> None:  # noqa: ANN001
    server = serve()
    server.wait_healthy()
    pid, port = server.embedded_s3()
    assert not _port_free(port)
    started = time.monotonic()
    server.process.send_signal(how)
    server.process.wait(timeout=30)
    wait_for(lambda: _gone(pid), 15, f"the embedded S3 server {pid} to exit after {how.name} of serve")
    wait_for(lambda: _port_free(port), 15, f"port {port} to be free")
    print(f"embedded S3 gone {time.monotonic() - started:.2f} s after {how.name}")
    if how is signal.SIGTERM:
        assert server.process.returncode in (0, 143), server.output


def test_the_embedded_s3_log_is_private(serve, tmp_path: Path) -> None:  # noqa: ANN001
    data_dir = tmp_path / "state"
    data_dir.mkdir(mode=0o700)
    log = data_dir / "embedded-s3.log"
    log.write_text("from an older serve\n")
    log.chmod(0o644)
    server = serve()
    server.wait_healthy()
    assert log.stat().st_mode & 0o777 == 0o600
    assert "from an older serve" in log.read_text()  # appended to, not replaced


def test_unisolated_local_jobs_are_said_and_a_second_tenant_is_refused(serve, tmp_path: Path) -> None:  # noqa: ANN001
    # The data dir is under pytest's 0700 tmp_path: another uid cannot reach it, so jobs would run
    # as the service's user (as they do whenever serve is not root).
    keys_file = tmp_path / "keys"
    keys_file.write_text("alice=AKIATGALICE000000001:alice-secret-0123456789abcdef\n"
                         "bob=AKIATGBOB00000000001:bob-secret-0123456789abcdefgh\n")  # fmt: skip
    keys_file.chmod(0o600)
    refused = serve({"TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE": str(keys_file)}, embedded_s3=False)
    assert refused.process.wait(timeout=60) == 2, refused.output
    assert "NOT ISOLATED" in refused.output and "TRAINGUARD_LOCAL_UNISOLATED_TENANTS=1" in refused.output

    accepted = serve({"TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE": str(keys_file),
                      "TRAINGUARD_LOCAL_UNISOLATED_TENANTS": "1"}, embedded_s3=False)  # fmt: skip
    accepted.wait_healthy()
    assert "local jobs: NOT ISOLATED" in accepted.output
    accepted.stop()

    alone = serve(embedded_s3=False)  # one tenant (the generated key): it starts, and says so
    alone.wait_healthy()
    assert "local jobs: NOT ISOLATED" in alone.output


def test_a_custom_rule_leaves_no_temporary_directory(tmp_path: Path) -> None:
    """The rule runner copies a job's rule file into a temporary directory: gone when it exits."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    source = tmp_path / "my_rule.py"
    source.write_text("from trainguard.rules import Rule\n")
    environment = {
        "PATH": os.environ.get("PATH", os.defpath), "TMPDIR": str(scratch),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "TRAINING_JOB_NAME": "job", "RULE_CONFIGURATION_NAME": "Mine", "RULE_TO_INVOKE": "NoSuchClass",
        "BASE_TRIAL": str(run), "RULE_SOURCE_URI": str(source),
    }  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "trainguard.services.rule_runner"], env=environment, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr  # the rule class is missing: its Error status
    assert "NoSuchClass" in result.stderr
    assert list(scratch.iterdir()) == []


@needs_root
def test_as_root_with_a_reachable_data_dir_jobs_are_isolated_and_tenants_allowed(tmp_path: Path) -> None:
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="tg-serve-"))
    try:
        os.chmod(base, 0o711)
        keys_file = base / "keys"
        keys_file.write_text("alice=AKIATGALICE000000001:alice-secret-0123456789abcdef\n"
                             "bob=AKIATGBOB00000000001:bob-secret-0123456789abcdefgh\n")  # fmt: skip
        keys_file.chmod(0o600)
        with traversable_for_jobs():
            server = Serve(base, {"TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE": str(keys_file)}, embedded_s3=False)
            try:
                server.wait_healthy()
                assert "local jobs: isolated: each job runs as its own user" in server.output, server.output
            finally:
                server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
