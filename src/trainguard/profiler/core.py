"""The profiler a training script (or ``trainguard run``) starts.

    from trainguard.profiler import Profiler
    with Profiler("runs/job1", interval_ms=500):   # system metrics + PyTorch step timings
        train()

One background thread samples the machine every ``interval_ms`` and does all file I/O
(system-metric lines, closed framework timelines, uploads to a store). The training thread only
appends events to a list. Any error in the profiler is logged once and switches it off: training
goes on (fail open).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import socket
import sys
import threading
import time
import weakref
from typing import Any

from trainguard.errors import ConfigError
from trainguard.profiler.layout import safe_node_name
from trainguard.profiler.output import ProfilerOutput, SystemMetricsWriter, open_output
from trainguard.profiler.timeline import TimelineWriter
from trainguard.storage.base import Store

__all__ = ["DEFAULT_FLUSH_S", "MIN_INTERVAL_MS", "Profiler", "flush_running_profilers", "start_from_environment"]

logger = logging.getLogger("trainguard")
MIN_INTERVAL_MS = 100
# How often the step timeline is closed into a file (and store files rewritten): live profiler
# rules see a stall within this many seconds, so jobs of a minute or less are profiled live too.
DEFAULT_FLUSH_S = 5.0

# Started and not yet stopped: the hook flushes them before it writes the end-of-training marker,
# so that a live rule runner, which stops reading at that marker, has seen every step timing.
_running: weakref.WeakSet[Profiler] = weakref.WeakSet()


def flush_running_profilers(*, training_ended: bool = False) -> None:
    """Write out now whatever every running profiler of this process holds. Never raises."""
    for profiler in list(_running):
        profiler.flush(training_ended=training_ended)


def _default_rank() -> int:
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _default_node() -> str:
    return os.environ.get("SM_CURRENT_HOST") or os.environ.get("TRAINGUARD_NODE_ID") or socket.gethostname()


class Profiler:
    """System sampler and (for PyTorch) per-step framework profiler of one process.

    Args:
        out_dir: the run directory (the hook's ``out_dir``), an ``s3://``/``memory://`` URL, or a
            Store; files go to its ``profiler-output/``.
        interval_ms: sampling interval of the system metrics, at least 100 (SageMaker offers 100,
            200, 500, 1000, 5000, 60000; any value ≥ 100 works here).
        framework: record per-step timings of PyTorch loops (needs torch; skipped with a log line
            when torch cannot be imported).
        system: sample CPU, memory, disk, network and GPUs.
        node_id: the node name in file names and records (default ``$SM_CURRENT_HOST``, then
            ``$TRAINGUARD_NODE_ID``, then the host name).
        rank: this process's rank (default ``$RANK``, else 0).
        rotate_max_bytes / rotate_interval_s: when a framework timeline file is closed (every
            ``DEFAULT_FLUSH_S`` seconds by default, and always before the hook's end marker).
        flush_interval_s: for store outputs, how often the current minute file is rewritten.
        store_options: passed to :func:`trainguard.storage.open_store` (e.g. ``endpoint_url``).
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | Store,
        interval_ms: int = 500,
        framework: bool = True,
        *,
        system: bool = True,
        node_id: str | None = None,
        rank: int | None = None,
        rotate_max_bytes: int = 10 * 1024 * 1024,
        rotate_interval_s: float = DEFAULT_FLUSH_S,
        flush_interval_s: float = DEFAULT_FLUSH_S,
        **store_options: Any,
    ) -> None:
        try:
            interval_ms = int(interval_ms)
        except (TypeError, ValueError):
            raise ConfigError(f"profiler interval_ms={interval_ms!r} is not a number of milliseconds") from None
        if interval_ms < MIN_INTERVAL_MS:
            raise ConfigError(f"profiler interval_ms={interval_ms} is below {MIN_INTERVAL_MS}; use 100 or more")
        if rotate_interval_s <= 0 or rotate_max_bytes <= 0:
            raise ConfigError("profiler rotate_interval_s and rotate_max_bytes must be positive")
        self.interval_s = interval_ms / 1000.0
        self.node = safe_node_name(node_id or _default_node())
        self.rank = _default_rank() if rank is None else int(rank)
        self.output: ProfilerOutput = open_output(out_dir, flush_interval_s, **store_options)
        self.want_framework = framework
        self.want_system = system
        self.enabled = True
        self._pending_files: queue.SimpleQueue[tuple[str, bytes]] = queue.SimpleQueue()
        self.timeline = TimelineWriter(
            lambda key, data: self._pending_files.put((key, data)), self.rank, self.node,
            rotate_max_bytes=rotate_max_bytes, rotate_interval_s=rotate_interval_s,
        )  # fmt: skip
        self._system_writer = SystemMetricsWriter(self.output, self.node)
        self._host: Any = None
        self._gpus: Any = None
        self._framework: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        # file I/O happens on the background thread, and on the hook's thread in flush()
        self._io_lock = threading.Lock()
        self.samples = 0
        self.thread_cpu_s = 0.0  # CPU seconds used by the background thread (set at stop)

    @property
    def url(self) -> str:
        return self.output.url

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> Profiler:
        """Start sampling and hooking. Never raises for a failure of the profiler itself."""
        with self._lock:
            if self._thread is not None:
                return self
            try:
                if self.want_system:
                    from trainguard.profiler.system import GpuSampler, HostSampler

                    self._host, self._gpus = HostSampler(), GpuSampler()
                if self.want_framework:
                    self._framework = self._start_framework()
            except Exception as error:  # noqa: BLE001 - fail open
                self._disable(error)
                return self
            self._thread = threading.Thread(target=self._run, name="trainguard-profiler", daemon=True)
            self._thread.start()
            atexit.register(self.stop)
            _running.add(self)
        return self

    def _start_framework(self) -> Any:
        # Never import torch here: zero-code runs start the profiler before the script imports
        # it (and a script may never use it); attach_framework() is called once it is imported.
        if "torch" not in sys.modules:
            return None
        from trainguard.profiler.framework import TorchStepProfiler

        return TorchStepProfiler(self.timeline).install()

    def attach_framework(self) -> None:
        """Install the PyTorch step timings now (torch was imported after :meth:`start`)."""
        with self._lock:
            if not self.enabled or not self.want_framework or self._framework is not None or self._thread is None:
                return
            try:
                self._framework = self._start_framework()
            except Exception as error:  # noqa: BLE001 - fail open
                self._disable(error)

    def stop(self) -> None:
        """Stop, write everything still in memory, and remove the hooks. Idempotent."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._stop.set()
        atexit.unregister(self.stop)
        _running.discard(self)
        try:
            if self._framework is not None:
                self._framework.close()
        except Exception as error:  # noqa: BLE001
            self._disable(error)
        thread.join(timeout=30)
        try:
            with self._io_lock:
                self.timeline.rotate()
                self._write_pending_files()
                self._system_writer.close()
                self.output.close()
        except Exception as error:  # noqa: BLE001
            self._disable(error)
        if self._gpus is not None:
            self._gpus.close()

    def flush(self, *, training_ended: bool = False) -> None:
        """Close the current timeline file and make every file visible now (the run goes on
        being profiled). ``training_ended``: the step in progress is the last one, record it
        too. Call it from the training thread. Fails open: never raises."""
        if not self.enabled:
            return
        try:
            if training_ended and self._framework is not None:
                self._framework.close_open_step()
            with self._io_lock:
                self.timeline.rotate()
                self._write_pending_files()
                self.output.flush(force=True)
        except Exception as error:  # noqa: BLE001 - fail open
            self._disable(error)

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- the background thread ----------------------------------------------------------------
    def _run(self) -> None:
        next_at = time.monotonic()
        while self.enabled:
            try:
                self._tick()
            except Exception as error:  # noqa: BLE001 - fail open: the profiler stops, training goes on
                self._disable(error)
                return
            next_at += self.interval_s
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a stalled machine): don't try to catch up in a burst
                next_at, delay = time.monotonic(), 0.0
            if self._stop.wait(delay):
                break
        try:
            self._tick()  # a last sample so short runs get at least two
        except Exception as error:  # noqa: BLE001
            self._disable(error)
        self.thread_cpu_s = time.thread_time()  # everything the background thread cost

    def _tick(self) -> None:
        now = time.time()
        with self._io_lock:
            if self._host is not None:
                metrics = self._host.sample(now) + self._gpus.sample()
                self._system_writer.write_sample(now, metrics)
                self.samples += 1
            self.timeline.maybe_rotate(now)
            self._write_pending_files()
            self.output.flush()

    def _write_pending_files(self) -> None:
        while True:
            try:
                key, data = self._pending_files.get_nowait()
            except queue.Empty:
                return
            self.output.write_file(key, data)

    def _disable(self, error: BaseException) -> None:
        if self.enabled:
            self.enabled = False
            if self._framework is not None:
                self._framework.enabled = False  # stop collecting events nobody will write
            from trainguard.hooks.fail_open import log_disabled

            log_disabled("the profiler", error)


def start_from_environment(environ: Any = None) -> Profiler | None:
    """Start a profiler if ``TRAINGUARD_PROFILER=1`` (what ``trainguard run`` sets for zero-code).

    Reads ``TRAINGUARD_OUT_DIR`` (the run directory; default ``./trainguard-runs/profiler``),
    ``TRAINGUARD_PROFILER_INTERVAL_MS`` (default 500), ``TRAINGUARD_PROFILER_FLUSH_S`` (how
    often step timings become visible to live rules, default 5 s) and
    ``TRAINGUARD_PROFILER_FRAMEWORK`` (``0`` turns the PyTorch step timings off). Returns None when not
    asked for, or when the
    configuration is bad (logged; the script runs unprofiled).
    """
    environ = os.environ if environ is None else environ
    if environ.get("TRAINGUARD_PROFILER") != "1":
        return None
    out_dir = environ.get("TRAINGUARD_OUT_DIR") or os.path.join("trainguard-runs", "profiler")
    options = {}
    if out_dir.startswith("s3://") and environ.get("S3_ENDPOINT_URL"):
        options["endpoint_url"] = environ["S3_ENDPOINT_URL"]
    try:
        raw_flush = environ.get("TRAINGUARD_PROFILER_FLUSH_S") or DEFAULT_FLUSH_S
        try:
            flush_s = float(raw_flush)
        except ValueError:
            raise ConfigError(f"TRAINGUARD_PROFILER_FLUSH_S={raw_flush!r} is not a number of seconds") from None
        if not flush_s > 0:
            raise ConfigError(f"TRAINGUARD_PROFILER_FLUSH_S={raw_flush!r} must be positive")
        profiler = Profiler(
            out_dir,
            interval_ms=environ.get("TRAINGUARD_PROFILER_INTERVAL_MS") or 500,
            rotate_interval_s=flush_s,
            flush_interval_s=flush_s,
            framework=environ.get("TRAINGUARD_PROFILER_FRAMEWORK", "1") != "0",
            **options,
        )
        return profiler.start()
    except Exception as error:  # noqa: BLE001 - fail open
        logger.warning("trainguard: profiler not started (%s: %s); training continues", type(error).__name__, error)
        return None
