"""A run's capture_stopped records kept beside it, for when the run itself refuses them.

A hook whose capture stops (a full disk, an unwritable store) writes ``capture_stopped/<worker>.json``
into the run, in space held back at start. A file system remounted read-only, or a store that is
gone, refuses even that: then the record goes into the directory named by
:data:`~trainguard.format.layout.CAPTURE_STATUS_DIR_VARIABLE` (``trainguard run`` makes a private
one for training and its rule runner), as ``<digest of the run>_<worker>.json`` holding the run's
``out_dir``. Trials read both places, so the summary and the rules say that capture stopped, at
which step and why, instead of judging the steps before as the whole run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from trainguard.format.layout import CAPTURE_STATUS_DIR_VARIABLE, CAPTURE_STOPPED_PREFIX

__all__ = ["read_capture_status_aside", "status_dir_from_environment", "write_capture_status_aside"]

logger = logging.getLogger("trainguard")


def status_dir_from_environment() -> Path | None:
    value = os.environ.get(CAPTURE_STATUS_DIR_VARIABLE, "")
    return Path(value) if value else None


def _run_id(out_dir: str) -> str:
    return hashlib.sha256(out_dir.rstrip("/").encode()).hexdigest()[:16]


def write_capture_status_aside(out_dir: str, key: str, data: bytes, refused: BaseException) -> bool:
    """Keep the record ``key`` (``capture_stopped/<worker>.json``) the run refused, beside it;
    False where no directory is configured or it cannot be written either. Never raises."""
    directory = status_dir_from_environment()
    if directory is None:
        return False
    worker = key[len(CAPTURE_STOPPED_PREFIX) :].removesuffix(".json")
    try:
        record = json.loads(data)
        record.update(out_dir=out_dir.rstrip("/"), worker=worker, recorded_aside=f"the run refused it: {refused}")
        target = directory / f"{_run_id(out_dir)}_{worker}.json"
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(record))
        os.replace(temporary, target)
    except Exception as error:  # noqa: BLE001 - best effort, at exit: the failure was logged already
        logger.debug("trainguard: could not keep the capture_stopped record beside the run: %s", error)
        return False
    return True


def read_capture_status_aside(out_dir: str, directory: Path | None) -> dict[str, dict[str, Any]]:
    """The records kept beside the run ``out_dir`` in ``directory``, by worker ({} for none)."""
    if directory is None:
        return {}
    found: dict[str, dict[str, Any]] = {}
    try:
        paths = sorted(directory.glob(f"{_run_id(out_dir)}_*.json"))
    except OSError:
        return {}
    for path in paths:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("out_dir") == out_dir.rstrip("/"):
            found[str(record.get("worker"))] = record
    return found
