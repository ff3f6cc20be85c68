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
to point boto3 and the SageMaker SDK at it: the generated key pair only when it is the one the
endpoint accepts (a configured TRAINGUARD_SAGEMAKER_ACCESS_KEYS[_FILE] replaces it).

The embedded S3 endpoint is a child process that dies with ``serve``: on SIGTERM/SIGINT through
the normal shutdown, on a kill -9 through the kernel (PR_SET_PDEATHSIG). Local jobs run as users
of their own when ``serve`` runs as root (:mod:`trainguard.services.launchers.local_isolation`);
otherwise it says so, and refuses more than one tenant unless TRAINGUARD_LOCAL_UNISOLATED_TENANTS=1.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import secrets
import signal
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


_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: the kernel SIGKILLs it when its parent dies (a kill -9 included)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(70)  # no way to be sure it goes with serve: rather not start (serve reports it)
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os._exit(70)


def _open_private_log(path: Path) -> int:
    """The log, appended to and readable by its owner only (it may show request paths and keys)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    os.fchmod(descriptor, 0o600)  # one from before may be wider
    return descriptor


@contextlib.contextmanager
def _embedded_endpoint(data_dir: Path) -> Iterator[str]:
    """moto's server on a free local port for the lifetime of the API; its URL."""
    port = _free_port()
    log = os.fdopen(_open_private_log(data_dir / "embedded-s3.log"), "ab")  # closed below
    parent = os.getpid()
    # Linux only (prctl); elsewhere the child is stopped by serve's own shutdown alone.
    tie = (lambda: _die_with_parent(parent)) if sys.platform.startswith("linux") else None
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=tie,
    )  # fmt: skip
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
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def _banner(environ: dict[str, str], credentials: dict[str, str] | None, generated_key: bool, isolation: str) -> str:
    """``generated_key``: the generated pair is the endpoint's key (no keys were configured)."""
    url = f"http://{environ.get('TRAINGUARD_HOST') or '127.0.0.1'}:{environ.get('TRAINGUARD_PORT') or '8080'}"
    lines = [f"trainguard serve: API on {url} (native REST under /v1, SageMaker-compatible at /)"]
    if credentials is not None:
        lines += [
            f"  credentials: {environ['TRAINGUARD_DATA_DIR']}/credentials.json (mode 0600)",
            "  native API:  Authorization: Bearer $(jq -r .api_token <that file>)",
        ]
    lines.append("  SageMaker SDK / boto3 (this shell):")
    if credentials is not None and generated_key:
        key_id, secret = credentials["sagemaker_access_key_id"], credentials["sagemaker_secret_access_key"]
        lines.append(f"    export AWS_ACCESS_KEY_ID={key_id} AWS_SECRET_ACCESS_KEY={secret} AWS_REGION=us-east-1")
    else:  # the configured keys replace the generated pair: printing it would offer a refused key
        where = environ.get("TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE") or "TRAINGUARD_SAGEMAKER_ACCESS_KEYS"
        lines.append(f"    AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY: a key pair of {where}; AWS_REGION=us-east-1")
    lines.append(f"    export AWS_ENDPOINT_URL_SAGEMAKER={url} AWS_ENDPOINT_URL_CLOUDWATCH_LOGS={url}")
    if environ.get("S3_ENDPOINT_URL"):
        lines.append(f"    export AWS_ENDPOINT_URL_S3={environ['S3_ENDPOINT_URL']}")
    if isolation:
        lines.append(f"  local jobs: {isolation}")
    return "\n".join(lines)


def _terminate_gracefully(signum: int, frame: object) -> None:
    # uvicorn re-raises the SIGTERM it shut down on; as SystemExit it unwinds serve (and stops the
    # embedded S3 endpoint) instead of killing the process where it stands.
    raise SystemExit(128 + signum)


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
    generated_key = False
    if not environ.get("TRAINGUARD_API_TOKEN"):
        credentials = load_or_create_credentials(data_dir)
        environ["TRAINGUARD_API_TOKEN"] = credentials["api_token"]
        if not environ.get("TRAINGUARD_SAGEMAKER_ACCESS_KEYS") and not environ.get(
            "TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE"
        ):
            environ["TRAINGUARD_SAGEMAKER_ACCESS_KEYS"] = (
                f"serve={credentials['sagemaker_access_key_id']}:{credentials['sagemaker_secret_access_key']}"
            )
            generated_key = True
    isolation, refusal = _local_isolation(environ, data_dir)
    if refusal:
        print(f"trainguard serve: {refusal}", file=sys.stderr, flush=True)
        return 2
    from trainguard.services.api.__main__ import run_api

    signal.signal(signal.SIGTERM, _terminate_gracefully)
    with contextlib.ExitStack() as stack:
        if not environ.get("S3_ENDPOINT_URL") and not args.no_embedded_s3 and _moto_available():
            endpoint = stack.enter_context(_embedded_endpoint(data_dir))
            everything_embedded = not any(
                environ.get(variable) for variable in ("CLOUDWATCH_ENDPOINT_URL", "TRAINGUARD_SNS_ENDPOINT_URL")
            )
            for variable in ("S3_ENDPOINT_URL", "CLOUDWATCH_ENDPOINT_URL", "TRAINGUARD_SNS_ENDPOINT_URL"):
                environ.setdefault(variable, endpoint)
            # moto accepts any credentials; the service's own S3 clients and the jobs' uploaders
            # need some to sign with. When every endpoint is the embedded one, the shell's own
            # cloud credentials have nothing to do here and are never handed on to jobs.
            for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                if everything_embedded:
                    environ[variable] = os.environ[variable] = "trainguard-embedded"
                else:
                    environ.setdefault(variable, "trainguard-embedded")
                    os.environ.setdefault(variable, environ[variable])
            if everything_embedded:
                for variable in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
                    environ.pop(variable, None)
                    os.environ.pop(variable, None)
        print(_banner(environ, credentials, generated_key, isolation), flush=True)
        from trainguard.services.api.routes_ui import announce_login_token

        url = f"http://{environ.get('TRAINGUARD_HOST') or '127.0.0.1'}:{environ.get('TRAINGUARD_PORT') or '8080'}"
        print(f"  dashboard:   {url}/ui/ (log in with a key pair or the API token; one-time operator login, "
              f"10 min: {url}/ui/login?once={announce_login_token()})", flush=True)  # fmt: skip
        return run_api(environ, args.log_level)


def _local_isolation(environ: dict[str, str], data_dir: Path) -> tuple[str, str]:
    """(what the banner says about local jobs, why serve refuses to start or ""), for the local launcher."""
    if (environ.get("TRAINGUARD_LAUNCHER") or "").strip().lower() != "local":
        return "", ""
    from trainguard.services.api.access_keys import AccessKeyStore
    from trainguard.services.launchers.base import LauncherError
    from trainguard.services.launchers.local_isolation import JobIsolation, unisolated_tenants_refusal

    from trainguard.errors import ConfigError

    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        isolation = JobIsolation(data_dir, sys.executable)
        tenants = len(AccessKeyStore.from_environ(environ, environ.get("TRAINGUARD_API_TOKEN", "").strip()))
    except (ConfigError, LauncherError, OSError) as error:
        return "", str(error)
    if isolation.available:
        return f"isolated: each job runs as its own user (uids from {isolation.uid_base + 1}), in its own directory", ""
    refusal = unisolated_tenants_refusal(tenants, environ)
    warning = f"NOT ISOLATED: {isolation.unavailable} (they can read this service's secrets and database)"
    return warning, f"{warning}; {refusal}" if refusal else ""


def _moto_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("moto") is not None
