"""How the rule runner finds the run it judges: it waits (up to ``wait_timeout``) for the run's
collections file, tells a job that ended without capturing anything from one not started yet,
and opens the trial the rules read."""

from __future__ import annotations

import threading
import time
from typing import Any

from trainguard.errors import MissingCollectionFiles, StorageError, TrialError

__all__ = ["NothingCaptured", "RunOpener"]


class NothingCaptured(TrialError):
    """Training ended and the run holds no capture at all."""


class RunOpener:
    """Opens the trial at ``trial_path`` once the run is there. ``open()`` returns None when
    ``stop_event`` is set while waiting; raises :class:`NothingCaptured` when training ended
    without a capture, :class:`TrialError` when the run did not appear in time."""

    def __init__(
        self,
        trial_path: str,
        *,
        endpoint_url: str | None,
        poll_interval: float,
        wait_timeout: float,
        stop_event: threading.Event,
        training_done: threading.Event,
    ) -> None:
        self.trial_path = trial_path
        self.endpoint_url = endpoint_url
        self.poll_interval = poll_interval
        self.wait_timeout = wait_timeout
        self.stop_event = stop_event
        self.training_done = training_done
        self._probe: Any = None  # see _probe_store

    def open(self) -> Any:
        from trainguard.trial import create_trial

        deadline = time.monotonic() + self.wait_timeout
        last_error: Exception | None = None
        while not self.stop_event.is_set():
            try:
                if not self._run_appeared():
                    raise MissingCollectionFiles(f"no collections file at {self.trial_path} yet")
                # Rules ask the trial many questions per step (tensor_names, has_tensor...); each
                # would list the run again, most of a live runner's CPU. The loop's own questions
                # refresh it once per poll.
                return create_trial(
                    self.trial_path, endpoint_url=self.endpoint_url, collection_wait_timeout=0,
                    refresh_interval=self._refresh_interval(),
                )  # fmt: skip
            except (MissingCollectionFiles, StorageError) as error:
                last_error = error
            if self.training_done.is_set() or self._ended_without_capture():
                raise NothingCaptured(f"training ended without capturing anything at {self.trial_path}")
            if time.monotonic() >= deadline:
                raise TrialError(
                    f"the run at {self.trial_path} did not appear within {self.wait_timeout:.0f} s ({last_error}). "
                    "Check that the path is the training job's tensor output (the hook's out_dir), or wait longer "
                    "(--wait-timeout)"
                )
            self.stop_event.wait(min(self.poll_interval, 1.0))
        return None

    def _refresh_interval(self) -> float:
        from trainguard.storage import is_remote

        return max(1.0, self.poll_interval) if is_remote(self.trial_path) else self.poll_interval

    def _probe_store(self) -> Any:
        """One store to look for the run while it is not there: opening a trial (or an S3 client)
        on every poll costs a noticeable share of a CPU on a loaded machine."""
        if self._probe is None:
            from trainguard.storage import is_remote, open_store

            remote = is_remote(self.trial_path)
            self._probe = open_store(
                self.trial_path, **({"endpoint_url": self.endpoint_url} if self.endpoint_url and remote else {})
            )
        return self._probe

    def _run_appeared(self) -> bool:
        from trainguard.format.layout import COLLECTIONS_PREFIX

        try:
            return bool(self._probe_store().list(COLLECTIONS_PREFIX))
        except (StorageError, OSError, ValueError):
            return True  # let opening the trial say what is wrong

    def _ended_without_capture(self) -> bool:
        """The end marker is there but no collections file: a job that captured nothing (its
        uploader writes the marker alone). Waiting longer cannot help."""
        from trainguard.format.layout import END_OF_TRAINING

        try:
            return self._probe_store().exists(END_OF_TRAINING)
        except (StorageError, OSError, ValueError):
            return False
