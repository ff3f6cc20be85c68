"""Group commit of job creations (services/api/job_creation.py) on a real SQLite file."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.exc import IntegrityError
from trainguard.services.api.db import (
    ComponentRow,
    JobRow,
    TransitionRow,
    checkpoint_wal,
    make_engine,
    make_session_factory,
)
from trainguard.services.api.job_creation import GroupCommit, NameClaims, NameTaken


def _rows(name: str) -> tuple[JobRow, list]:
    now = time.time()
    job = JobRow(
        name=name, arn=f"arn:{name}", source="native", spec={}, request=None, launcher="local", runner_token="t",
        status="InProgress", secondary_status="Starting", failure_reason="", creation_time=now,
        last_modified_time=now, stop_status="", stop_cause="", settled=False,
    )  # fmt: skip
    children = [
        TransitionRow(job_name=name, status="Starting", start_time=now, message=""),
        ComponentRow(job_name=name, role="training", state="Pending", updated=now, reason=""),
    ]
    return job, children


@pytest.fixture
def database(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'api.db'}")
    commits: list[float] = []
    event.listen(engine, "commit", lambda _connection: commits.append(time.time()))
    # A slow disk: each commit takes 30 ms, as an fsync did here while jobs started beside the API.
    event.listen(engine, "commit", lambda _connection: time.sleep(0.03))
    return make_session_factory(engine), commits


def test_concurrent_creations_share_commits_and_all_land(database) -> None:
    sessions, commits = database
    group = GroupCommit(sessions)
    errors: list[BaseException] = []
    start = threading.Barrier(20)

    def create(index: int) -> None:
        start.wait()
        try:
            group.commit(*_rows(f"job-{index}"))
        except BaseException as error:  # noqa: BLE001 - collected for the assertion
            errors.append(error)

    threads = [threading.Thread(target=create, args=(index,)) for index in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(JobRow)) == 20
        assert session.scalar(select(func.count()).select_from(ComponentRow)) == 20
        assert session.scalar(select(func.count()).select_from(TransitionRow)) == 20
    # 20 creations at once: far fewer commits than creations (one at a time would be 20).
    assert len(commits) <= 5, commits


def test_a_name_taken_meanwhile_refuses_only_that_creation(database) -> None:
    sessions, _commits = database
    group = GroupCommit(sessions)
    # Another API process on the same database inserted "taken" after this one checked the name.
    with sessions() as session:
        job, children = _rows("taken")
        session.add(job)
        session.commit()
    outcomes: dict[str, str] = {}
    start = threading.Barrier(6)

    def create(name: str) -> None:
        start.wait()
        try:
            group.commit(*_rows(name))
            outcomes[name] = "ok"
        except IntegrityError:
            outcomes[name] = "refused"

    names = ["taken", "a", "b", "c", "d", "e"]
    threads = [threading.Thread(target=create, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert outcomes == {"taken": "refused", "a": "ok", "b": "ok", "c": "ok", "d": "ok", "e": "ok"}
    with sessions() as session:
        landed = set(session.scalars(select(ComponentRow.job_name)))
    assert landed == {"a", "b", "c", "d", "e"}  # the refused creation left no child row behind


def test_a_claimed_or_existing_name_is_taken(database) -> None:
    sessions, _commits = database
    claims = NameClaims(sessions)
    with claims.claim("x"):
        with pytest.raises(NameTaken):
            with claims.claim("x"):
                pass
    with claims.claim("x"):  # released after the first creation
        GroupCommit(sessions).commit(*_rows("x"))
    with pytest.raises(NameTaken):
        with claims.claim("x"):
            pass


def test_the_reconcilers_checkpoint_copies_the_whole_log(tmp_path) -> None:
    path = tmp_path / "api.db"
    engine = make_engine(f"sqlite:///{path}")
    sessions = make_session_factory(engine)
    for index in range(30):
        GroupCommit(sessions).commit(*_rows(f"job-{index}"))

    def jobs_in_the_database_file() -> int:
        # immutable=1 reads the database file alone, ignoring the write-ahead log.
        with sqlite3.connect(f"file:{path}?immutable=1", uri=True) as reader:
            try:
                return reader.execute("SELECT count(*) FROM jobs").fetchone()[0]
            except sqlite3.OperationalError:  # not even the table is in the file yet
                return 0

    # SQLite's own threshold (a backstop far above 30 commits) has not copied the log yet.
    assert jobs_in_the_database_file() == 0
    checkpoint_wal(engine)
    assert jobs_in_the_database_file() == 30
