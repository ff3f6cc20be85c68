"""Which writer a hook gets: the writer process where it can run, else the thread writer; and
the writer process started ahead of the first save for a hook that will likely use one."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from trainguard.priority import nice_from_environment
from trainguard.storage.base import Store
from trainguard.storage.local import LocalStore
from trainguard.writer.process import ProcessStepWriter
from trainguard.writer.spawn import WriterChild, WriterUnavailable, in_multiprocessing_child
from trainguard.writer.thread import StepWriter

__all__ = ["open_step_writer", "start_ahead"]

logger = logging.getLogger("trainguard")


def open_step_writer(
    store: Store,
    worker: str,
    *,
    kind: str = "thread",
    max_pending_bytes: int = 256 << 20,
    on_error: Callable[[BaseException], None] | None = None,
    started: WriterChild | None = None,
) -> StepWriter | ProcessStepWriter:
    """The writer ``kind`` names: "process" where it can run (a local store, shared memory, a
    process started), else the thread writer; "auto" is "process" for local stores.
    ``started``: a writer process from :func:`start_ahead`, adopted or stopped here."""
    if kind in ("process", "auto") and isinstance(store, LocalStore):
        try:
            return ProcessStepWriter(
                store, worker, max_pending_bytes=max_pending_bytes, on_error=on_error, started=started
            )
        except WriterUnavailable as error:
            logger.info("trainguard: writing from a thread instead of a process: %s", error)
    elif started is not None:
        started.discard()
    return StepWriter(store, worker, max_pending_bytes=max_pending_bytes, on_error=on_error)


def start_ahead(store: Store, kind: str, max_pending_bytes: int) -> WriterChild | None:
    """A writer process started now for the writer :func:`open_step_writer` will likely open
    at the first save (spawn.py says why); None where it would not be one, or in a
    ``multiprocessing`` child (a spawned DataLoader worker). Never raises: a failure here only
    means the process starts at the first save, as it would have."""
    if kind not in ("process", "auto") or not isinstance(store, LocalStore) or in_multiprocessing_child():
        return None
    try:
        nice = nice_from_environment("TRAINGUARD_WRITER_NICE", ProcessStepWriter.NICE)
        ring_size = ProcessStepWriter.ring_size_for(max_pending_bytes)
        return WriterChild(os.fspath(store.root), ring_size, nice, None)
    except Exception as error:  # noqa: BLE001 - fail open: the first save starts one
        logger.debug("trainguard: writer process not started ahead: %s", error)
        return None
