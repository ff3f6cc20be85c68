"""What is wrong with a run: damaged files, each with its step, and a capture that stopped early.

A part of :class:`~trainguard.trial.trial.Trial` (a mixin): it reads the trial's listing state,
its store and the records its reads found damaged.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.errors import ChecksumMissing, FormatError, StorageError
from trainguard.format.layout import CAPTURE_STOPPED_PREFIX, parse_event_key
from trainguard.storage.capture_status import read_capture_status_aside
from trainguard.trial.state import Damage, RunState

if TYPE_CHECKING:
    from trainguard.storage.base import Store

__all__ = ["RunHealth", "read_capture_stopped"]

logger = logging.getLogger("trainguard")


def read_capture_stopped(store: Store, status_dir: Path | None) -> dict[str, dict[str, Any]]:
    """Worker -> capture-stopped record of the run in ``store`` (see :meth:`RunHealth.capture_stopped`)."""
    # records the run refused (a read-only file system) were kept beside it by the hook
    stopped = read_capture_status_aside(store.url, status_dir)
    for key in store.list(CAPTURE_STOPPED_PREFIX):
        worker = key[len(CAPTURE_STOPPED_PREFIX) :].removesuffix(".json")
        try:
            stopped[worker] = json.loads(store.read(key))
        except (ValueError, StorageError) as error:
            stopped[worker] = {"reason": f"unreadable marker: {error}"}
    return stopped


class RunHealth:
    """Damage and capture-stopped records of a trial's run."""

    store: Store
    _state: RunState
    _capture_status_dir: Path | None
    # event files named by an index that were still absent after the wait
    _missing_event_files: set[str]
    # event file -> what was wrong with a record read from it (corrupt, checksum mismatch)
    _damaged_records: dict[str, str]

    if TYPE_CHECKING:

        def refresh(self, force: bool = False) -> None: ...  # the trial's

    def capture_stopped(self) -> dict[str, dict[str, Any]]:
        """Workers whose hook stopped capturing early (a full disk, a read-only file system, an
        internal error), with step and reason.

        A run listed here holds no steps after the given one for that worker. The record is in
        the run (``capture_stopped/<worker>.json``, with the end marker) or, when the run
        refused writes altogether, beside it (see :mod:`trainguard.storage.capture_status`).
        """
        return read_capture_stopped(self.store, self._capture_status_dir)

    @property
    def payload_checksums_required(self) -> bool:
        """Whether the run's writer checksums every payload (its collections file says so, as
        trainguard's hooks do): then an index entry without a checksum is damage."""
        return self._state.checksums_required

    def damage(self) -> list[Damage]:
        """Everything found damaged in the run so far, by step: each with the file (relative to
        the run), the step and worker whose data it held, and what is wrong.

        Found by listing: unreadable (truncated, corrupt) index files, index entries without the
        payload checksum the run promised (altered or damaged index: their values are refused on
        read with :class:`~trainguard.errors.ChecksumMissing`), and, once training has ended,
        event files without an index. Found by reading: event files an index names that do not
        exist, and records that are corrupt or fail their checksum
        (:class:`~trainguard.errors.FormatError` on read). Each was logged once as a warning;
        a damaged step leaves the others readable.
        """
        self.refresh()
        found = self._state.damage()
        # A file that was missing when read but is there now came late (a store that lost its
        # objects and had them uploaded again, a lagging replica): not damage, and a read waits
        # for it again.
        late = {key for key in self._missing_event_files if self._exists_now(key)}
        self._missing_event_files.difference_update(late)
        for key in self._missing_event_files:
            step, worker = parse_event_key(key) or (None, None)
            found.append(Damage(step, worker, key, "event file named by an index but missing"))
        for key, problem in self._damaged_records.items():
            step, worker = parse_event_key(key) or (None, None)
            found.append(Damage(step, worker, key, problem))
        return sorted(found, key=lambda item: (item.step is None, item.step or 0, item.key))

    def _exists_now(self, key: str) -> bool:
        try:
            return bool(self.store.exists(key))
        except StorageError:  # cannot tell: it stays reported
            return False

    def damaged_steps(self) -> dict[int, list[str]]:
        """Global steps whose data is damaged, each with ``"<file>: <problem>"`` (see :meth:`damage`)."""
        steps: dict[int, list[str]] = {}
        for item in self.damage():
            if item.step is not None:
                steps.setdefault(item.step, []).append(f"{item.key}: {item.problem}")
        return steps

    def unreadable_files(self) -> dict[str, str]:
        """Damaged files of the run, each with why (keys relative to the run; see :meth:`damage`)."""
        return {item.key: item.problem for item in sorted(self.damage(), key=lambda item: item.key)}

    def _note_damaged_record(self, event_file: str, name: str, step: int, error: FormatError) -> None:
        """Remember (and log once per file) a record that failed on read, for :meth:`damage`."""
        if isinstance(error, ChecksumMissing):
            return  # its index was reported when listed (RunState.unchecksummed_indexes)
        if event_file not in self._damaged_records:
            self._damaged_records[event_file] = f"record of {name!r} at byte {error.offset}: {error.problem}"
            logger.warning("trainguard: step %d is damaged: %s", step, error)
