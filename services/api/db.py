"""State in SQL through SQLAlchemy: SQLite by default, any SQLAlchemy URL (postgresql://...) works.

Everything the API knows lives here, so a restarted API (new process, same database) carries on:
jobs, their secondary-status transitions, components, rule evaluations, metric datapoints,
alarms and the actions they ran.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Integer, String, Text, create_engine, event, inspect
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker
from sqlalchemy.schema import DefaultClause
from trainguard.services.api.policy import OPERATOR

__all__ = [
    "ActionRow",
    "AlarmRow",
    "Base",
    "ComponentRow",
    "JobRow",
    "MetricRow",
    "RuleRow",
    "TransitionRow",
    "checkpoint_wal",
    "make_engine",
    "make_session_factory",
]


class Base(DeclarativeBase):
    pass


class JobRow(Base):
    __tablename__ = "jobs"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    arn: Mapped[str] = mapped_column(String(256))
    source: Mapped[str] = mapped_column(String(16))  # "native" | "sagemaker"
    spec: Mapped[dict] = mapped_column(JSON)  # the normalised job spec (trainguard.services.api.schemas.JobSpec)
    request: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # SageMaker request, echoed by Describe
    launcher: Mapped[str] = mapped_column(String(16))
    runner_token: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), index=True)
    secondary_status: Mapped[str] = mapped_column(String(32))
    failure_reason: Mapped[str] = mapped_column(Text, default="")
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    creation_time: Mapped[float] = mapped_column(Float, index=True)
    training_start_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    training_end_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_modified_time: Mapped[float] = mapped_column(Float)
    stop_requested_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    stop_status: Mapped[str] = mapped_column(String(32), default="")  # "Stopped" | "MaxRuntimeExceeded"
    stop_cause: Mapped[str] = mapped_column(Text, default="")
    settled: Mapped[bool] = mapped_column(Boolean, default=False)  # terminal and every component exited
    # Who created the job: an access key's name, or "operator" (the API token; jobs from before tenancy).
    owner: Mapped[str] = mapped_column(String(64), default=OPERATOR, server_default=OPERATOR, index=True)


class TransitionRow(Base):
    __tablename__ = "secondary_transitions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_name: Mapped[str] = mapped_column(ForeignKey("jobs.name", ondelete="CASCADE"), index=True)
    status: Mapped[str] = mapped_column(String(32))
    start_time: Mapped[float] = mapped_column(Float)
    end_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")


class ComponentRow(Base):
    __tablename__ = "components"

    job_name: Mapped[str] = mapped_column(ForeignKey("jobs.name", ondelete="CASCADE"), primary_key=True)
    role: Mapped[str] = mapped_column(String(300), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    updated: Mapped[float] = mapped_column(Float)


class RuleRow(Base):
    __tablename__ = "rule_evaluations"

    job_name: Mapped[str] = mapped_column(ForeignKey("jobs.name", ondelete="CASCADE"), primary_key=True)
    configuration_name: Mapped[str] = mapped_column(String(256), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # "debug" | "profiler"
    rule: Mapped[str] = mapped_column(String(512))
    evaluation_job_arn: Mapped[str] = mapped_column(String(256))
    launched: Mapped[bool] = mapped_column(Boolean, default=True)
    status: Mapped[str] = mapped_column(String(16))
    status_details: Mapped[str] = mapped_column(Text, default="")
    last_modified_time: Mapped[float] = mapped_column(Float)
    last_evaluated_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    findings: Mapped[list] = mapped_column(JSON, default=list)  # fired StepResult dicts (last 50)
    missing: Mapped[list] = mapped_column(JSON, default=list)
    fix_hint: Mapped[str] = mapped_column(Text, default="")
    actions: Mapped[list] = mapped_column(JSON, default=list)


class MetricRow(Base):
    __tablename__ = "metric_data"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_name: Mapped[str] = mapped_column(ForeignKey("jobs.name", ondelete="CASCADE"), index=True)
    configuration_name: Mapped[str] = mapped_column(String(256))
    metric_name: Mapped[str] = mapped_column(String(128))
    value: Mapped[float] = mapped_column(Float)
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    timestamp: Mapped[float] = mapped_column(Float)


class ReportSequenceRow(Base):
    """The last report a rule runner's outbox had applied: a replayed report is applied once."""

    __tablename__ = "rule_report_sequences"

    job_name: Mapped[str] = mapped_column(ForeignKey("jobs.name", ondelete="CASCADE"), primary_key=True)
    configuration_name: Mapped[str] = mapped_column(String(256), primary_key=True)
    outbox: Mapped[str] = mapped_column(String(64), primary_key=True)
    sequence: Mapped[int] = mapped_column(Integer)


class AlarmRow(Base):
    __tablename__ = "alarms"

    job_name: Mapped[str] = mapped_column(ForeignKey("jobs.name", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(256), primary_key=True)
    spec: Mapped[dict] = mapped_column(JSON)  # trainguard.services.alarms.AlarmSpec.to_dict()
    state: Mapped[str] = mapped_column(String(20), default="INSUFFICIENT_DATA")
    state_reason: Mapped[str] = mapped_column(Text, default="")
    updated: Mapped[float] = mapped_column(Float)


class ActionRow(Base):
    __tablename__ = "action_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_name: Mapped[str] = mapped_column(ForeignKey("jobs.name", ondelete="CASCADE"), index=True)
    alarm_name: Mapped[str] = mapped_column(String(256))
    action_name: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), index=True)  # Pending | Running | Succeeded | Failed
    detail: Mapped[str] = mapped_column(Text, default="")
    action: Mapped[dict] = mapped_column(JSON, default=dict)  # the action's config
    extra: Mapped[dict] = mapped_column(JSON, default=dict)  # alarm, rule, reason, finding for the event
    created: Mapped[float] = mapped_column(Float)
    finished: Mapped[float | None] = mapped_column(Float, nullable=True)


_BACKSTOP_CHECKPOINT_PAGES = 20000  # about 80 MB of log


def make_engine(url: str, *, durable_commits: bool = True) -> Engine:
    """An engine for ``url``; SQLite files get their folder, WAL mode and a busy timeout.

    ``durable_commits=False`` (SQLite only) commits without an fsync (``synchronous=NORMAL`` in WAL
    mode: never corrupt, but the last commits may roll back after a power loss or OS crash, not
    after a process crash). For writes that can be derived again, such as the reconciler's, which
    re-reads every job's state from the launcher on each tick: an fsync per job transition would
    hold SQLite's single write lock for its whole duration, and creations would queue behind it.
    """
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(connection: sqlite3.Connection, _record: object) -> None:
            cursor = connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            if not durable_commits:
                cursor.execute("PRAGMA synchronous=NORMAL")
            # Checkpoints (WAL -> database file, with an fsync of the file) run in the reconciler
            # (checkpoint_wal), not in whichever request's commit crosses SQLite's 1000-page
            # threshold; this larger threshold stays as a backstop when no reconciler runs.
            cursor.execute(f"PRAGMA wal_autocheckpoint={_BACKSTOP_CHECKPOINT_PAGES}")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def checkpoint_wal(engine: Engine) -> None:
    """Copy SQLite's write-ahead log into the database file without blocking writers (PASSIVE)."""
    if engine.dialect.name != "sqlite":
        return
    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")


# Columns added after a table was first created: (table, column). create_all makes missing tables
# but never alters an existing one, so a database from an older version gets these added here.
_ADDED_COLUMNS = (("jobs", "owner"),)


def _add_missing_columns(engine: Engine) -> None:
    """ALTER TABLE ... ADD COLUMN for each of _ADDED_COLUMNS an existing table lacks (with its default)."""
    for table_name, column_name in _ADDED_COLUMNS:
        present = {column["name"] for column in inspect(engine).get_columns(table_name)}
        if column_name in present:
            continue
        column = Base.metadata.tables[table_name].columns[column_name]
        kind = column.type.compile(dialect=engine.dialect)
        default = column.server_default.arg if isinstance(column.server_default, DefaultClause) else None
        clause = f" NOT NULL DEFAULT '{default}'" if default is not None else ""
        try:
            with engine.begin() as connection:
                connection.exec_driver_sql(f"ALTER TABLE {table_name} ADD COLUMN {column_name} {kind}{clause}")
        except DBAPIError:
            # Another API process on the same database added it first; anything else is raised.
            if column_name not in {c["name"] for c in inspect(engine).get_columns(table_name)}:
                raise
        for index in column.table.indexes:
            if column_name in index.columns:
                try:
                    index.create(engine, checkfirst=True)
                except DBAPIError:
                    if index.name not in {i["name"] for i in inspect(engine).get_indexes(table_name)}:
                        raise


def make_session_factory(engine: Engine) -> sessionmaker:
    """Sessions on ``engine``; its tables are created, or migrated to the current columns, first."""
    Base.metadata.create_all(engine)
    _add_missing_columns(engine)
    return sessionmaker(engine, expire_on_commit=False)
