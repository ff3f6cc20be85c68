"""A step whose index cannot be written (the disk filled up between its event file and its index)
leaves nothing behind that reads as a damaged step, and says which step it was."""

from __future__ import annotations

import numpy as np
import pytest

from trainguard.errors import StorageError
from trainguard.format.layout import event_key
from trainguard.modes import ModeKeys
from trainguard.storage import MemoryStore
from trainguard.writer.step_file import StepFile


class _FullForIndexes(MemoryStore):
    def write(self, key: str, data: object) -> None:
        if key.startswith("index/"):
            raise StorageError(f"cannot write {key}: the disk is full")
        super().write(key, data)  # type: ignore[arg-type]


def test_an_index_that_cannot_be_written_takes_its_event_file_with_it() -> None:
    store = _FullForIndexes("full")
    step_file = StepFile(store, "worker_0")
    step_file.begin(7, ModeKeys.TRAIN, 7)
    step_file.tensor("w", np.ones(3, np.float32))
    with pytest.raises(StorageError, match="disk is full"):
        step_file.end()
    assert not store.exists(event_key(7, "worker_0"))  # no event file without an index
    assert step_file.step == 7  # what the writer reports as the step capture stopped at
    step_file.abort_quietly()
    step_file.begin(8, ModeKeys.TRAIN, 8)
    assert step_file.step == 8
