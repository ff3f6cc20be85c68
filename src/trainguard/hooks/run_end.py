"""The end of a run of several workers: worker 0 writes the end marker after the others' last files.

Readers (a trial, a rule runner) and uploaders take ``training_job_end.ts`` for "nothing more
comes". In a run of several workers only worker 0 writes it, and written at worker 0's own close
it could come before a slower worker's last steps: a live rule then ended without them and an
uploader that had put the marker never sent them. So every worker of such a run writes its own
``workers_ended/<worker>.ts`` after its last file, and worker 0 writes the end marker once all of
them are there (with ``include_workers="one"``, all of those that write at all: the other ranks'
losses and scalars). A worker killed before it could write its own must not keep the run open forever:
after ``wait_seconds`` worker 0 writes the end marker anyway and names the missing workers in the
log.

Worker 0 waits on a thread of its own when the hook is closed during training (a script that
closes the hook and then meets the other ranks in a barrier must not wait for itself); at
interpreter exit, where training is over, it waits on the closing thread. The thread is not a
daemon, so the interpreter waits for the marker before it exits (at most ``wait_seconds``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time

from trainguard.errors import ConfigError, StorageError
from trainguard.format.layout import (
    CAPTURE_STOPPED_PREFIX,
    COLLECTIONS_PREFIX,
    END_OF_TRAINING,
    worker_end_key,
    worker_name,
    worker_of_collections_key,
)
from trainguard.storage import Store

__all__ = [
    "DEFAULT_PEER_WAIT_SECONDS",
    "final_objects",
    "flush_profilers",
    "mark_end_after_peers",
    "peer_wait_seconds",
    "start_end_marker_thread",
]

logger = logging.getLogger("trainguard")

# Ranks of a data-parallel job leave their last collective within moments of each other; a
# minute covers one that still evaluates or saves a checkpoint, and bounds the exit of a job
# whose other rank was killed.
DEFAULT_PEER_WAIT_SECONDS = 60.0
PEER_WAIT_ENV = "TRAINGUARD_PEER_END_WAIT_SECONDS"
_POLL_SECONDS = 0.2


def peer_wait_seconds(environment: dict[str, str] | os._Environ[str] | None = None) -> float:
    """How long worker 0 waits for the other workers' end (``TRAINGUARD_PEER_END_WAIT_SECONDS``)."""
    raw = (os.environ if environment is None else environment).get(PEER_WAIT_ENV)
    if raw is None or raw == "":
        return DEFAULT_PEER_WAIT_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ConfigError(f"{PEER_WAIT_ENV}={raw!r} must be a number of seconds >= 0")
    return seconds


def mark_end_after_peers(store: Store, world: int, wait_seconds: float, *, only_writers: bool = False) -> list[str]:
    """Wait until every other worker wrote its end key (at most ``wait_seconds``), then write the
    run's end marker. ``only_writers`` (``include_workers="one"``, where a rank may write nothing
    at all): wait only for the workers that wrote their collections file by then. Returns the
    workers that had not ended (logged)."""
    waiting = [worker_name(rank) for rank in range(1, world)]
    if only_writers:
        wrote = _workers_with_collections(store)
        waiting = [worker for worker in waiting if worker in wrote]
    deadline = time.monotonic() + wait_seconds
    while True:
        waiting = [worker for worker in waiting if not _exists(store, worker_end_key(worker))]
        remaining = deadline - time.monotonic()
        if not waiting or remaining <= 0:
            break
        time.sleep(min(_POLL_SECONDS, remaining))
    if waiting:
        logger.warning(
            "trainguard: %s did not end within %.0f s of worker_0 (killed, or still running); the end marker "
            "is written without them, so readers will not wait for their later steps (%s sets the wait)",
            ", ".join(waiting), wait_seconds, PEER_WAIT_ENV,
        )  # fmt: skip
    store.write(END_OF_TRAINING, b"")
    return waiting


def start_end_marker_thread(
    store: Store, world: int, wait_seconds: float, *, only_writers: bool = False
) -> threading.Thread:
    """:func:`mark_end_after_peers` on a non-daemon thread; failures are logged, never raised."""
    thread = threading.Thread(
        target=_mark_end_logged, args=(store, world, wait_seconds, only_writers), name="trainguard-end-marker",
        daemon=False,
    )  # fmt: skip
    thread.start()
    return thread


def _mark_end_logged(store: Store, world: int, wait_seconds: float, only_writers: bool) -> None:
    try:
        mark_end_after_peers(store, world, wait_seconds, only_writers=only_writers)
    except Exception as error:  # noqa: BLE001 - training's process: log, never raise
        logger.warning("trainguard: could not write %s in %s: %s", END_OF_TRAINING, store.url, error)


def _workers_with_collections(store: Store) -> set[str]:
    try:
        keys = store.list(COLLECTIONS_PREFIX)
    except StorageError:
        return set()
    return {worker for key in keys if (worker := worker_of_collections_key(key)) is not None}


def _exists(store: Store, key: str) -> bool:
    try:
        return store.exists(key)
    except StorageError:
        return False  # asked again at the next poll, until the wait is over


def final_objects(
    worker: str | None, world: int, *, stopped_because: dict[str, object] | None, light_worker: bool
) -> list[tuple[str, bytes]]:
    """What a worker writes after its last step, in this order: why its capture stopped (if it
    did), its own end key in a run of several workers, the run's end marker in a run of one."""
    objects = []
    if stopped_because is not None and worker is not None:
        # The end marker says "no more data"; this says the run is truncated, and why,
        # so that readers and rules do not take a crippled capture for a full one.
        objects.append((f"{CAPTURE_STOPPED_PREFIX}{worker}.json", json.dumps(stopped_because).encode()))
    if world > 1 and worker is not None:
        objects.append((worker_end_key(worker), b""))  # after this worker's last file
    if world == 1 and not light_worker:
        objects.append((END_OF_TRAINING, b""))
    return objects


def flush_profilers() -> None:
    """Step timings still in a profiler's memory go out before the end marker: a live rule
    runner stops reading at that marker. Only when the profiler is in use (never imported here)."""
    profiler_core = sys.modules.get("trainguard.profiler.core")
    if profiler_core is not None:
        profiler_core.flush_running_profilers(training_ended=True)
