"""``trainguard serve``: the control API as a verb of the ``trainguard`` command.

The core CLI never imports service code; it discovers this verb through the
``trainguard.commands`` entry-point group (see pyproject.toml), so ``pip install
'trainguard[service]'`` is all it takes. Command-line options override the environment variables
listed in :mod:`trainguard.services.api.settings`; everything else is read from the environment.

With nothing configured it runs the embedded one-machine service: SQLite and local processes
under ``--data-dir``, an API token and a SageMaker key pair generated on first start (random,
kept in ``<data dir>/credentials.json`` with mode 0600: there is no default secret), and, when no
S3 endpoint is configured, an embedded S3/CloudWatch/SNS-compatible endpoint (moto's server, in
memory) for the SageMaker SDK's uploads, channels and model artifacts. It prints what to export
to point boto3 and the SageMaker SDK at it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

__all__ = ["register"]

# option name -> the environment variable it overrides
_OVERRIDES = {
    "host": "TRAINGUARD_HOST",
    "port": "TRAINGUARD_PORT",
    "data_dir": "TRAINGUARD_DATA_DIR",
    "database_url": "TRAINGUARD_DATABASE_URL",
    "launcher": "TRAINGUARD_LAUNCHER",
}
_KEY_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the control API (native REST and SageMaker-compatible); needs trainguard[service]",
        description="Run the trainguard control API. Without configuration: SQLite and local jobs under "
        "--data-dir, generated credentials, an embedded S3 endpoint. `python -m trainguard.services.api "
        "--help` lists every setting.",
    )
    parser.add_argument("--host", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default 8080)")
    parser.add_argument("--data-dir", help="where jobs' files, credentials and the SQLite database live")
    parser.add_argument("--database-url", help="SQLAlchemy URL of the state database (e.g. postgresql+psycopg://...)")
    parser.add_argument("--launcher", choices=("local", "docker", "ray"), help="where jobs run")
    parser.add_argument(
        "--no-embedded-s3", action="store_true", help="do not start the embedded S3 endpoint when none is configured"
    )
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.set_defaults(func=_serve)


def _new_key_id() -> str:
    return "AKIATG" + "".join(secrets.choice(_KEY_ALPHABET) for _ in range(14))


def load_or_create_credentials(data_dir: Path) -> dict[str, str]:
    """The embedded service's secrets: made once, random, readable by the owner only."""
    path = data_dir / "credentials.json"
    if path.is_file():
        return json.loads(path.read_text())
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    credentials = {
        "api_token": secrets.token_urlsafe(32),
        "sagemaker_access_key_id": _new_key_id(),
        "sagemaker_secret_access_key": secrets.token_urlsafe(30),
    }
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(credentials, handle, indent=2)
    return credentials


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _embedded_endpoint(data_dir: Path) -> Iterator[str]:
    """moto's server on a free local port for the lifetime of the API; its URL."""
    port = _free_port()
    log = open(data_dir / "embedded-s3.log", "ab")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(
                        f"trainguard serve: the embedded S3 endpoint did not start (see {log.name})"
                    ) from None
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        log.close()


def _banner(environ: dict[str, str], credentials: dict[str, str] | None) -> str:
    url = f"http://{environ.get('TRAINGUARD_HOST') or '127.0.0.1'}:{environ.get('TRAINGUARD_PORT') or '8080'}"
    lines = [f"trainguard serve: API on {url} (native REST under /v1, SageMaker-compatible at /)"]
    if credentials is not None:
        lines += [
            f"  credentials: {environ['TRAINGUARD_DATA_DIR']}/credentials.json (mode 0600)",
            "  native API:  Authorization: Bearer $(jq -r .api_token <that file>)",
        ]
        key_id, secret = credentials["sagemaker_access_key_id"], credentials["sagemaker_secret_access_key"]
        lines += ["  SageMaker SDK / boto3 (this shell):",
                  f"    export AWS_ACCESS_KEY_ID={key_id} AWS_SECRET_ACCESS_KEY={secret} AWS_REGION=us-east-1",
                  f"    export AWS_ENDPOINT_URL_SAGEMAKER={url} AWS_ENDPOINT_URL_CLOUDWATCH_LOGS={url}"]  # fmt: skip
    if environ.get("S3_ENDPOINT_URL"):
        lines.append(f"    export AWS_ENDPOINT_URL_S3={environ['S3_ENDPOINT_URL']}")
    return "\n".join(lines)


def _serve(args: argparse.Namespace) -> int:
    environ = dict(os.environ)
    for option, variable in _OVERRIDES.items():
        value = getattr(args, option)
        if value is not None:
            environ[variable] = str(value)
    # The embedded one-machine service runs jobs as local processes unless told otherwise: its
    # embedded S3 endpoint listens on loopback, which containers cannot reach.
    environ.setdefault("TRAINGUARD_LAUNCHER", "local")
    data_dir = Path(environ.get("TRAINGUARD_DATA_DIR") or "trainguard-service").resolve()
    environ["TRAINGUARD_DATA_DIR"] = str(data_dir)
    credentials = None
    if not environ.get("TRAINGUARD_API_TOKEN"):
        credentials = load_or_create_credentials(data_dir)
        environ["TRAINGUARD_API_TOKEN"] = credentials["api_token"]
        if not environ.get("TRAINGUARD_SAGEMAKER_ACCESS_KEYS") and not environ.get(
            "TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE"
        ):
            environ["TRAINGUARD_SAGEMAKER_ACCESS_KEYS"] = (
                f"serve={credentials['sagemaker_access_key_id']}:{credentials['sagemaker_secret_access_key']}"
            )
    from trainguard.services.api.__main__ import run_api

    with contextlib.ExitStack() as stack:
        if not environ.get("S3_ENDPOINT_URL") and not args.no_embedded_s3 and _moto_available():
            endpoint = stack.enter_context(_embedded_endpoint(data_dir))
            for variable in ("S3_ENDPOINT_URL", "CLOUDWATCH_ENDPOINT_URL", "TRAINGUARD_SNS_ENDPOINT_URL"):
                environ.setdefault(variable, endpoint)
            # moto accepts any credentials; the service's own S3 clients (and the job processes,
            # which inherit this process's environment) need some to sign with.
            for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                environ.setdefault(variable, "trainguard-embedded")
                os.environ.setdefault(variable, environ[variable])
        print(_banner(environ, credentials), flush=True)
        return run_api(environ, args.log_level)


def _moto_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("moto") is not None
