"""The API on a real PostgreSQL server (started by the test), including a restart on it."""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.s3_server import free_port
from tests.services.conftest import CUSTOM_RULE, HOOK_EVERY_STEP, training_command, wait_for

pytestmark = pytest.mark.slow


def _postgres_bin() -> Path | None:
    for candidate in [shutil.which("pg_ctl"), *sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), reverse=True)]:
        if candidate and Path(candidate).exists():
            return Path(candidate).resolve().parent
    return None


@pytest.fixture
def postgres_url() -> Iterator[str]:
    binaries = _postgres_bin()
    if binaries is None or not (binaries / "initdb").exists():
        pytest.skip("PostgreSQL server binaries not installed (apt-get install -y postgresql)")
    if importlib.util.find_spec("psycopg") is None:
        pytest.skip("the PostgreSQL driver is missing: pip install 'psycopg[binary]'")
    # initdb refuses to run as root: run the server as the 'postgres' user when we are root.
    prefix: list[str] = []
    owner = None
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server as")
        prefix = ["runuser", "-u", "postgres", "--"]
    root = Path(tempfile.mkdtemp(prefix="tg-pg-"))
    root.chmod(0o755)
    data = root / "data"
    if owner is not None:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    port = free_port()
    run = lambda *argv: subprocess.run([*prefix, *argv], check=True, capture_output=True, timeout=120)  # noqa: E731
    run(str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync")
    run(str(binaries / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60",
        "-o", f"-p {port} -k {root} -h 127.0.0.1 -F", "start")  # fmt: skip
    try:
        run(str(binaries / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "trainguard")
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/trainguard"
    finally:
        subprocess.run(
            [*prefix, str(binaries / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


def test_jobs_live_in_postgres_across_an_api_restart(api_factory, postgres_url) -> None:
    api = api_factory(TRAINGUARD_DATABASE_URL=postgres_url)
    spec = {
        "name": "pg-job",
        "command": training_command("--steps", "6"),
        "hook_config": HOOK_EVERY_STEP,
        "rules": [{"rule": CUSTOM_RULE, "name": "LossWatch"}],
    }
    status, body = api.request("POST", "/v1/jobs", spec)
    assert status == 201, body
    job = wait_for(
        lambda: (j := api.job("pg-job"))["status"] == "Completed" and j["rules"][0]["status"] != "InProgress" and j,
        90, "the job and its rule to finish",
    )  # fmt: skip
    assert job["rules"][0]["status"] == "NoIssuesFound"
    api.kill()
    api.start()
    after = api.job("pg-job")
    assert (after["status"], after["rules"][0]["status"]) == ("Completed", "NoIssuesFound")
    assert after["secondary_status_transitions"] == job["secondary_status_transitions"]
    # The rows really are in Postgres, not in a SQLite file next to the data dir.
    assert not list(api.data_dir.glob("*.db"))
    import sqlalchemy

    with sqlalchemy.create_engine(postgres_url).connect() as connection:
        assert (
            connection.execute(sqlalchemy.text("select status from jobs where name = 'pg-job'")).scalar() == "Completed"
        )
