"""Every path of a run, in one place (smdebug 1.0.34's layout).

::

    <run>/collections/000000000/<worker>_collections.json
    <run>/events/<S12>/<S12>_<worker>.tfevents
    <run>/index/<I9>/<S12>_<worker>.json        I9 = step // 1000
    <run>/training_job_end.ts
    <run>/workers_ended/<worker>.ts             trainguard only, runs of several workers
    <run>/tensorboard/<MODE>/...

All keys are relative to the run root and use ``/`` on every platform.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "COLLECTIONS_PREFIX",
    "CAPTURE_STATUS_DIR_VARIABLE",
    "CAPTURE_STOPPED_PREFIX",
    "END_OF_TRAINING",
    "RUN_EXIT_RECORD",
    "EVENTS_PREFIX",
    "INDEX_PREFIX",
    "IndexKey",
    "collections_key",
    "event_key",
    "index_key",
    "parse_event_key",
    "parse_index_key",
    "WORKERS_ENDED_PREFIX",
    "worker_end_key",
    "worker_of_collections_key",
    "worker_name",
]

END_OF_TRAINING = "training_job_end.ts"
# trainguard only: how the command under ``trainguard run`` ended. Written with ``"returncode": null``
# when the command starts and again once it has exited, which is after the hook's end marker (the
# marker is written at the interpreter's exit): an uploader that sees null holds the end marker back
# until the final record is there, so the copy on S3 says how training ended too.
RUN_EXIT_RECORD = "trainguard-exit.json"
# trainguard only (smdebug readers ignore it): why a worker stopped capturing before the end.
CAPTURE_STOPPED_PREFIX = "capture_stopped/"
# Where the capture_stopped record of a run goes when the run itself refuses it (its file system
# remounted read-only, its store gone): a private directory ``trainguard run`` makes and names in
# this variable for training and its rule runner; records there name their run (``out_dir``).
CAPTURE_STATUS_DIR_VARIABLE = "TRAINGUARD_CAPTURE_STATUS_DIR"
# trainguard only (smdebug readers ignore it): in a run of several workers, each one's "I wrote
# my last file". Worker 0 writes END_OF_TRAINING once all of them are there, so that the end
# marker, which readers and uploaders take for "nothing more comes", is true for every worker.
WORKERS_ENDED_PREFIX = "workers_ended/"
EVENTS_PREFIX = "events/"
INDEX_PREFIX = "index/"
COLLECTIONS_PREFIX = "collections/000000000/"

_INDEX_RE = re.compile(r"^index/(\d{9})/(\d+)_(.+)\.json$")
_EVENT_RE = re.compile(r"^events/\d+/(\d+)_(.+)\.tfevents$")
_COLLECTIONS_RE = re.compile(r"^collections/000000000/(.*_?collections)\.json$")


def worker_name(rank: int) -> str:
    return f"worker_{rank}"


def worker_end_key(worker: str) -> str:
    return f"{WORKERS_ENDED_PREFIX}{worker}.ts"


def event_key(step: int, worker: str) -> str:
    return f"events/{step:012d}/{step:012d}_{worker}.tfevents"


def index_key(step: int, worker: str) -> str:
    return f"index/{step // 1000:09d}/{step:012d}_{worker}.json"


def collections_key(worker: str) -> str:
    return f"{COLLECTIONS_PREFIX}{worker}_collections.json"


def worker_of_collections_key(key: str) -> str | None:
    """``worker_1`` for ``collections/000000000/worker_1_collections.json``; None for other keys."""
    match = _COLLECTIONS_RE.match(key)
    return match.group(1).removesuffix("_collections") if match else None


def is_collections_key(key: str) -> bool:
    return _COLLECTIONS_RE.match(key) is not None


@dataclass(frozen=True, order=True)
class IndexKey:
    """A parsed index file name. Steps come from the file name, as in smdebug."""

    step: int
    worker: str
    key: str


def parse_index_key(key: str) -> IndexKey | None:
    """Parse ``index/<I9>/<S12>_<worker>.json``; None for anything else (temp files...)."""
    match = _INDEX_RE.match(key)
    if match is None:
        return None
    return IndexKey(step=int(match.group(2)), worker=match.group(3), key=key)


def parse_event_key(key: str) -> tuple[int, str] | None:
    """(step, worker) of ``events/<S12>/<S12>_<worker>.tfevents``; None for anything else."""
    match = _EVENT_RE.match(key)
    return None if match is None else (int(match.group(1)), match.group(2))
