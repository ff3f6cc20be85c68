"""TensorBoard export: a run's scalars and histograms as standard TensorBoard event files.

Usage::

    export_run("/tmp/run", "/tmp/tb")   # {'scalars': 12, 'histograms': 40, 'files': 2}
    # then: tensorboard --logdir /tmp/tb

One directory per mode (``<tensorboard_dir>/TRAIN``, ``.../EVAL``), so TensorBoard shows each
mode as its own run with the mode's own step numbers, as smdebug's TensorBoard output does.
The files are TFRecords with real CRCs (smdebug's constant footer would make TensorBoard stop
at the first record) and only ever appear whole: locally each is written under a temporary
name that TensorBoard ignores (no "tfevents" in it) and renamed into place when complete; on
S3 an object is visible only once uploaded.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from trainguard.errors import ConfigError, StorageError
from trainguard.format.proto import event_pb2
from trainguard.format.record import frame
from trainguard.modes import ModeKeys
from trainguard.storage import open_store
from trainguard.storage.options import StorageOptions
from trainguard.trial import Trial, create_trial

__all__ = ["FILE_VERSION", "ExportProgress", "TensorBoardWriter", "export_run", "make_histogram"]

logger = logging.getLogger("trainguard")

FILE_VERSION = "brain.Event:2"
EXPORT_SUFFIX = ".trainguard"
# TensorFlow's histograms end with a bucket up to DBL_MAX; TensorBoard replaces that outer edge
# with the histogram's max when it draws, so the last limit only has to be "everything above".
_DBL_MAX = sys.float_info.max
# Least seconds between two progress reports of a long export (``trainguard tensorboard``).
PROGRESS_INTERVAL = 1.0


def make_histogram(values: Any, bins: int = 30) -> event_pb2.HistogramProto | None:
    """A TensorBoard ``HistogramProto`` of ``values`` (any shape; bool, int or float).

    Bucket ``i`` counts values below ``bucket_limit[i]`` and at or above the previous limit;
    the first bucket is open to the left and the last limit is DBL_MAX (TensorFlow's layout).
    Edges, min, max, sum and sum_squares come from the finite values only, so one inf cannot
    stretch the plot to nothing; -inf and +inf are counted in the outer buckets and in ``num``.
    NaN fits no bucket and is left out of every field. Returns None when no value is finite:
    there is no range to draw.
    """
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ConfigError(f"bins must be a positive integer, got {bins!r}")
    array = np.asarray(values)
    if array.dtype.kind not in "biuf":
        raise ConfigError(f"a histogram needs bool, integer or float values, got dtype {array.dtype}")
    x = array.reshape(-1).astype(np.float64)
    finite_mask = np.isfinite(x)
    finite = x[finite_mask]
    if finite.size == 0:
        return None
    below = int(np.count_nonzero(x == -np.inf))
    above = int(np.count_nonzero(x == np.inf))
    try:
        with np.errstate(all="ignore"):
            counts, edges = np.histogram(finite, bins=bins)
        limits = [float(edge) for edge in edges[1:-1]] + [_DBL_MAX]
    except ValueError:  # a finite range too wide for float64 arithmetic (about ±1e308)
        counts, limits = np.array([finite.size]), [_DBL_MAX]
    counts = counts.astype(np.float64)
    counts[0] += below
    counts[-1] += above
    with np.errstate(over="ignore"):  # overflow to inf is the honest answer for huge values
        total = float(np.sum(finite))
        squares = float(np.dot(finite, finite))
    return event_pb2.HistogramProto(
        min=float(finite.min()),
        max=float(finite.max()),
        num=float(finite.size + below + above),
        sum=total,
        sum_squares=squares,
        bucket_limit=limits,
        bucket=counts.tolist(),
    )


class _LocalFile:
    """A local event file. Atomic: under a temporary name TensorBoard ignores (no "tfevents" in
    it) until commit renames it into place. In place: flushed per event for live readers."""

    def __init__(self, path: Path, atomic: bool) -> None:
        self.atomic = atomic
        self._path = path
        self._target = path.with_name(f".trainguard-{secrets.token_hex(6)}.tmp") if atomic else path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # open() rather than mkstemp: mkstemp's 0600 would hide the file from a TensorBoard
            # server running as another user; open() applies the umask like any other file.
            self._file = open(self._target, "wb")  # noqa: SIM115 - closed in commit/abort
        except OSError as error:
            raise _storage_error("create", path, error) from error

    def write(self, data: bytes) -> None:
        try:
            self._file.write(data)
            if not self.atomic:
                self._file.flush()
        except OSError as error:
            self.abort()
            raise _storage_error("write", self._path, error) from error

    def commit(self) -> None:
        try:
            self._file.flush()
            os.fsync(self._file.fileno())  # the rename must not publish a file still only in cache
            self._file.close()
            if self.atomic:
                os.replace(self._target, self._path)
        except OSError as error:
            self.abort()
            raise _storage_error("write", self._path, error) from error

    def abort(self) -> None:
        self._file.close()
        if self.atomic:
            try:
                os.unlink(self._target)
            except FileNotFoundError:
                pass


class TensorBoardWriter:
    """Writes one TensorBoard event file into ``logdir`` (a local directory or ``s3://...``).

    Values added for the same step go into one event, written when a value for another step
    arrives or on :meth:`flush`. With ``atomic=True`` (the default) the file appears under its
    final name only on :meth:`close`; with ``atomic=False`` (local only) it is written in place
    and flushed per event, for live writing: TensorBoard's reader retries a record it finds cut
    short. Leaving a ``with`` block by an exception discards an atomic file unpublished.
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        *,
        atomic: bool = True,
        filename_suffix: str = EXPORT_SUFFIX,
        endpoint_url: str | None = None,
        profile: str | None = None,
        region: str | None = None,
    ) -> None:
        self.logdir = _local_path(logdir)
        self.filename = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}{filename_suffix}"
        self._sink: Any
        if self.logdir is None:
            if not atomic:
                raise ConfigError(f"atomic=False needs a local directory; {logdir} is remote (objects appear whole)")
            self.url = f"{os.fspath(logdir).rstrip('/')}/{self.filename}"
            self._sink = open_store(logdir, **StorageOptions(endpoint_url, profile, region).store_kwargs()).open_writer(
                self.filename
            )
        else:
            self.url = os.fspath(self.logdir / self.filename)
            self._sink = _LocalFile(self.logdir / self.filename, atomic)
        self._pending: event_pb2.Event | None = None
        self._closed = False
        self.events_written = 0
        self._write(event_pb2.Event(wall_time=time.time(), file_version=FILE_VERSION))

    def __enter__(self) -> TensorBoardWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None or isinstance(self._sink, _LocalFile) and not self._sink.atomic:
            self.close()
        else:
            self.discard()

    def add_scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        self._values(step, wall_time).add(tag=tag, simple_value=float(value))

    def add_histogram(
        self, tag: str, values: Any, step: int, *, bins: int = 30, wall_time: float | None = None
    ) -> bool:
        """Add a histogram of ``values``; False (nothing added) when none of them is finite."""
        histogram = make_histogram(values, bins)
        if histogram is None:
            return False
        self._values(step, wall_time).add(tag=tag, histo=histogram)
        return True

    def flush(self) -> None:
        """Write the pending step's event (to the file; an atomic file is still unpublished)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._write(pending)

    def close(self) -> None:
        """Write what is pending and publish the file under its final name. Idempotent."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._sink.commit()

    def discard(self) -> None:
        """Drop an atomic file unpublished (an in-place file keeps what was written)."""
        if not self._closed:
            self._closed = True
            self._sink.abort()

    def _values(self, step: int, wall_time: float | None) -> Any:
        if self._closed:
            raise ConfigError(f"TensorBoardWriter for {self.url} is closed; create a new one")
        step = int(step)
        if self._pending is not None and self._pending.step != step:
            self.flush()
        if self._pending is None:
            self._pending = event_pb2.Event(step=step, wall_time=time.time() if wall_time is None else wall_time)
        return self._pending.summary.value

    def _write(self, event: event_pb2.Event) -> None:
        try:
            self._sink.write(frame(event.SerializeToString(), real_checksum=True))
        except BaseException:
            self.discard()  # a file missing an event must not be published as if whole
            raise
        self.events_written += 1


class ExportProgress:
    """Calls ``report(done, total)`` (steps converted so far, steps to convert) at most every
    ``interval`` seconds while an export runs, and once more at its end if it reported before:
    an export shorter than ``interval`` says nothing, a long one never looks stuck."""

    def __init__(
        self,
        total: int,
        report: Callable[[int, int], None],
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.done, self._report, self._clock = total, 0, report, clock
        self._interval = PROGRESS_INTERVAL if interval is None else interval
        self._last = clock()
        self.reported = False

    def step_done(self) -> None:
        self.done += 1
        now = self._clock()
        if now - self._last >= self._interval and self.done < self.total:
            self._last = now
            self._emit()

    def finish(self) -> None:
        if self.reported:
            self._emit()

    def _emit(self) -> None:
        self.reported = True
        try:
            self._report(self.done, self.total)
        except Exception:  # noqa: BLE001 - a broken progress printer must not fail the export
            logger.debug("trainguard: tensorboard progress report failed", exc_info=True)


def export_run(
    run_path: str | os.PathLike[str] | Trial,
    tensorboard_dir: str | os.PathLike[str],
    *,
    histograms: bool = True,
    scalar_only: bool = False,
    bins: int = 30,
    endpoint_url: str | None = None,
    profile: str | None = None,
    region: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, int]:
    """Write a run's saved tensors as TensorBoard event files, one directory per mode.

    Tensors of one element (losses, metrics, saved reductions ``smdebug/reductions/...``)
    become scalars; larger numeric tensors become histograms, unless ``scalar_only`` or
    ``histograms=False``, or every collection that names the tensor has ``save_histogram``
    off. Strings and complex numbers are skipped. A live run is exported as far as its complete
    steps go; export again later to extend it. Each export replaces the previous trainguard
    export in the same directories, so give each run a ``tensorboard_dir`` of its own. With
    several workers, each step's values are the first worker's. ``endpoint_url``, ``profile``
    and ``region`` are for ``s3://`` paths, the run's and ``tensorboard_dir``'s (default: the
    environment, :mod:`trainguard.storage.options`).

    ``progress(done, total)``: steps converted and steps to convert, at most every
    ``PROGRESS_INTERVAL`` seconds during a long export and once at its end (see
    :class:`ExportProgress`).

    Returns counts: {"scalars": values written, "histograms": values written, "files": files}.
    """
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ConfigError(f"bins must be a positive integer, got {bins!r}")
    # An export reads what is there now: a wrong path fails at once instead of waiting for a
    # run to appear (create_trial's default, meant for readers started before training).
    storage = StorageOptions(endpoint_url, profile, region)
    trial = run_path if isinstance(run_path, Trial) else create_trial(
        run_path, collection_wait_timeout=0, **storage.store_kwargs()
    )
    want_histograms = histograms and not scalar_only
    collections = list(trial.collections().values())
    histogram_wanted: dict[str, bool] = {}
    counts = {"scalars": 0, "histograms": 0, "files": 0}
    plan = []
    for mode in trial.modes():
        steps = trial.steps(mode)
        if mode == ModeKeys.GLOBAL:  # GLOBAL numbering lists every step; keep the mode-less ones
            steps = [step for step in steps if trial.mode(step) == ModeKeys.GLOBAL]
        if steps:
            plan.append((mode, steps))
    tracker = ExportProgress(sum(len(steps) for _, steps in plan), progress or (lambda done, total: None))
    for mode, steps in plan:
        mode_dir = f"{os.fspath(tensorboard_dir).rstrip('/')}/{mode.name}"
        with TensorBoardWriter(mode_dir, endpoint_url=endpoint_url, profile=profile, region=region) as writer:
            for step in steps:
                names = trial.tensor_names(show_prefixed_tensors=True, step=step, mode=mode)
                values = trial.tensor_values(names, step, mode)
                # One wall time per step: the trial does not expose when a step was saved.
                wall_time = time.time()
                for name in names:
                    value = values[name]
                    if value.dtype.kind not in "biuf" or value.size == 0:
                        continue
                    if value.size == 1:
                        writer.add_scalar(name, value.reshape(-1)[0], step, wall_time)
                        counts["scalars"] += 1
                        continue
                    if not want_histograms:
                        continue
                    if name not in histogram_wanted:
                        matching = [collection for collection in collections if collection.matches(name)]
                        histogram_wanted[name] = not matching or any(c.save_histogram for c in matching)
                    if histogram_wanted[name] and writer.add_histogram(
                        name, value, step, bins=bins, wall_time=wall_time
                    ):
                        counts["histograms"] += 1
                tracker.step_done()
        counts["files"] += 1
        _remove_older_exports(mode_dir, writer.filename, storage)
    tracker.finish()
    return counts


def _remove_older_exports(logdir: str, keep: str, storage: StorageOptions) -> None:
    """Delete earlier exports beside the new file: TensorBoard would show both, step by step."""
    store = open_store(logdir, **storage.store_kwargs())
    for key in store.list("events.out.tfevents."):
        if "/" not in key and key.endswith(EXPORT_SUFFIX) and key != keep:
            try:
                store.delete(key)
            except StorageError as error:
                logger.warning(
                    "trainguard: could not remove the older TensorBoard export %s/%s: %s", logdir, key, error
                )


def _local_path(logdir: str | os.PathLike[str]) -> Path | None:
    text = os.fspath(logdir)
    if text.startswith("file://"):
        return Path(text[len("file://") :])
    return None if "://" in text else Path(text)


def _storage_error(action: str, path: Path, error: OSError) -> StorageError:
    reason = "the disk is full" if error.errno == errno.ENOSPC else error.strerror or str(error)
    return StorageError(f"cannot {action} TensorBoard file {path}: {reason}")
