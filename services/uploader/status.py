"""The uploader's status file: what it is doing, written by the uploader, read by the reconciler.

``python -m trainguard.services.uploader`` keeps one small JSON document at ``--status-file``
(default: beside its state file, so ``<source>/.uploader-status.json`` where the control API plans
it; hidden, so it is never uploaded), replaced atomically (temp file + ``os.replace``) so a reader
sees one whole document::

    {"version": 1, "attempt": "<random id of this process>", "state": "following",
     "started_at": 1764680000.1, "updated_at": 1764680012.5, "last_pass_at": 1764680012.4,
     "passes": 25, "counts": {"files": 40, "bytes": 81920, ...}, "error": null}

``state`` is one of :data:`STATES`: ``following`` once its SIGTERM handler is in place (told
"training ended" before that, an uploader still starting dies of the signal instead of finishing),
``finishing`` once told, ``done`` (the end marker was up by itself), ``stopped`` (told to finish:
it sent the rest, verified S3 and wrote the end marker last) or ``failed`` (``error`` says why).
``attempt`` tells a restarted uploader's document from the one its dead predecessor left behind.

The reconciler reads it through the launcher (``Launcher.read_file``), so this works where the
uploader's output is elsewhere (a container, another Ray node); the log lines the uploader prints
(:func:`ready_line`, :func:`final_record`) are for people reading its log.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "FINISHED_STATES",
    "READY_STATES",
    "STATES",
    "STATUS_FILE_NAME",
    "STATUS_MAX_BYTES",
    "StatusWriter",
    "UploaderStatus",
    "default_status_path",
    "final_record",
    "parse_status",
    "ready_line",
]

STATUS_FILE_NAME = ".uploader-status.json"
STATUS_MAX_BYTES = 64 * 1024  # a reader reads no more: the document is a few hundred bytes
_VERSION = 1
STATES = ("following", "finishing", "done", "stopped", "failed")
READY_STATES = frozenset({"following", "finishing", "done", "stopped"})  # its SIGTERM handler is in place
FINISHED_STATES = frozenset({"done", "stopped"})  # its last pass done, the end marker last
log = logging.getLogger("trainguard.uploader")


def default_status_path(state_file: Path) -> Path:
    """Where the status goes when not told: beside the state file."""
    return state_file.with_name(STATUS_FILE_NAME)


@dataclass(frozen=True)
class UploaderStatus:
    attempt: str
    state: str
    started_at: float
    updated_at: float
    last_pass_at: float | None = None
    passes: int = 0
    counts: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ready(self) -> bool:
        return self.state in READY_STATES

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    def to_json(self) -> str:
        return json.dumps({"version": _VERSION, **asdict(self)}, separators=(",", ":"))


def parse_status(raw: bytes | None) -> UploaderStatus | None:
    """The document in ``raw``; None when there is none or it is not one this version wrote
    (a reader that cannot tell treats the uploader as having said nothing)."""
    if not raw or len(raw) > STATUS_MAX_BYTES:
        return None
    try:
        document = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("version") != _VERSION:
        return None
    attempt, state = document.get("attempt"), document.get("state")
    started, updated = document.get("started_at"), document.get("updated_at")
    if not isinstance(attempt, str) or state not in STATES:
        return None
    if not isinstance(started, (int, float)) or not isinstance(updated, (int, float)):
        return None
    last_pass = document.get("last_pass_at")
    passes, counts, error = document.get("passes"), document.get("counts"), document.get("error")
    return UploaderStatus(
        attempt=attempt,
        state=state,
        started_at=float(started),
        updated_at=float(updated),
        last_pass_at=float(last_pass) if isinstance(last_pass, (int, float)) else None,
        passes=passes if isinstance(passes, int) else 0,
        counts=counts if isinstance(counts, dict) else {},
        error=error if isinstance(error, str) else None,
    )


class StatusWriter:
    """Keeps one uploader's status file current.

    State changes are written at once; passes at most every ``pass_interval_s`` (a pass runs every
    poll interval, and the reader needs the state, not every pass). A write that fails (the
    training's disk is full) is logged once and never stops uploading: the reconciler then waits
    its longest for a ready uploader, which costs time, not files.
    """

    def __init__(self, path: Path, *, pass_interval_s: float = 1.0) -> None:
        self.path = path
        self.pass_interval_s = pass_interval_s
        now = time.time()
        self.status = UploaderStatus(attempt=uuid.uuid4().hex, state="following", started_at=now, updated_at=now)
        self._last_write = 0.0  # monotonic
        self._failed = False

    def set_state(self, state: str, counts: dict[str, Any], error: str | None = None) -> None:
        if state not in STATES:
            raise ValueError(f"uploader state {state!r} is not one of {', '.join(STATES)}")
        self.status = replace(self.status, state=state, counts=counts, error=error, updated_at=time.time())
        self._write()

    def passed(self, counts: dict[str, Any]) -> None:
        now = time.time()
        self.status = replace(
            self.status, passes=self.status.passes + 1, last_pass_at=now, updated_at=now, counts=counts
        )
        if time.monotonic() - self._last_write >= self.pass_interval_s:
            self._write()

    def _write(self) -> None:
        self._last_write = time.monotonic()
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temp.write_text(self.status.to_json())
            os.replace(temp, self.path)
        except OSError as error:
            if not self._failed:
                log.warning("cannot write the status file %s (%s); uploading goes on", self.path, error)
            self._failed = True
            try:
                temp.unlink(missing_ok=True)
            except OSError:
                pass
            return
        self._failed = False


def ready_line(source: str, dest: str) -> str:
    """The log line saying the uploader is at work (for people: the reconciler reads the file)."""
    return f"uploader: following {source} -> {dest}"


def final_record(outcome: str, summary: dict[str, Any]) -> str:
    """The uploader's last log line: ``{"uploader": outcome, ...counts}``."""
    return json.dumps({"uploader": outcome, **summary})
