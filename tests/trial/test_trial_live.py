"""The trial reader on synthetic runs written by the real step writer: live following,
incremental listing, batched reads, waits with timeouts, and clear errors."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from trainguard.config.collections import CollectionManager
from trainguard.errors import (
    FormatError,
    MissingCollectionFiles,
    NoMoreData,
    StepNotYetAvailable,
    TensorUnavailable,
    TensorUnavailableForStep,
    WaitTimeout,
)
from trainguard.format.layout import END_OF_TRAINING, collections_key, event_key
from trainguard.modes import ModeKeys
from trainguard.storage import LocalStore, MemoryStore, Store
from trainguard.trial import StepState, Trial, create_trial
from trainguard.writer.thread import StepWriter


class CountingStore:
    """Wraps a store and records list and read calls, to prove how the reader uses it."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.list_calls: list[tuple[str, str | None, int]] = []
        self.reads: list[tuple[str, int, int | None]] = []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.inner, name)

    @property
    def url(self) -> str:
        return self.inner.url

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        keys = self.inner.list(prefix, start_after)
        self.list_calls.append((prefix, start_after, len(keys)))
        return keys

    def read(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        self.reads.append((key, start, length))
        return self.inner.read(key, start, length)


def write_steps(store: Store, steps: Sequence[tuple[int, ModeKeys, int]], worker: str = "worker_0", num_workers: int = 1, end: bool = True) -> None:
    writer = StepWriter(store, worker)
    writer.write_object(collections_key(worker), CollectionManager.pytorch_defaults().render(num_workers))
    for step, mode, mode_step in steps:
        writer.begin_step(step, mode, mode_step)
        for name in ("Net_fc.weight", "gradient/Net_fc.weight", "CrossEntropyLoss_output_0"):
            value = np.full((2, 3), float(step), dtype=np.float32) if "fc" in name else np.array(float(step) / 10)
            writer.add_tensor(name, value, nbytes=value.nbytes)
        writer.end_step()
    if end:
        writer.write_object(END_OF_TRAINING, b"")
    assert writer.close()


def test_finished_run_api(tmp_path) -> None:
    store = LocalStore(tmp_path)
    write_steps(store, [(0, ModeKeys.TRAIN, 0), (1, ModeKeys.TRAIN, 1), (2, ModeKeys.EVAL, 0), (3, ModeKeys.TRAIN, 2)])
    trial = create_trial(tmp_path)
    assert trial.steps() == [0, 1, 2, 3]
    assert trial.steps(ModeKeys.TRAIN) == [0, 1, 2]
    assert trial.steps(ModeKeys.EVAL) == [0]
    assert trial.modes() == [ModeKeys.TRAIN, ModeKeys.EVAL]
    assert trial.workers() == ["worker_0"]
    assert trial.loaded_all_steps
    assert trial.mode(2) == ModeKeys.EVAL and trial.mode_step(3) == 2
    assert trial.global_step(ModeKeys.TRAIN, 2) == 3
    assert trial.tensor_names(collection="weights") == ["Net_fc.weight"]
    assert trial.tensor_names(regex="^grad") == ["gradient/Net_fc.weight"]
    assert trial.tensor_names(step=0, mode=ModeKeys.EVAL) == sorted(["Net_fc.weight", "gradient/Net_fc.weight", "CrossEntropyLoss_output_0"])
    weight = trial.tensor("Net_fc.weight")
    np.testing.assert_array_equal(weight.value(2, mode=ModeKeys.TRAIN), np.full((2, 3), 3.0, np.float32))
    assert sorted(weight.values(ModeKeys.EVAL)) == [0]
    assert weight.reduction_value(1, "l2") == pytest.approx(np.sqrt(6.0))
    assert weight.reduction_value(1, "max", abs=True) == pytest.approx(1.0)
    assert weight.prev_steps(3, 2) == [1, 2]
    assert weight.workers(1) == ["worker_0"]


def test_follows_a_live_run_incrementally(tmp_path) -> None:
    inner = LocalStore(tmp_path)
    write_steps(inner, [(0, ModeKeys.TRAIN, 0)], end=False)
    store = CountingStore(inner)
    trial = Trial(store)
    assert trial.steps() == [0]
    assert not trial.loaded_all_steps
    assert trial.has_passed_step(5) == StepState.NOT_YET_AVAILABLE
    with pytest.raises(StepNotYetAvailable):
        trial.tensor("Net_fc.weight").value(5)

    def produce() -> None:
        writer = StepWriter(inner, "worker_0")
        for step in range(1, 6):
            time.sleep(0.02)
            writer.begin_step(step, ModeKeys.TRAIN, step)
            writer.add_tensor("Net_fc.weight", np.full(3, float(step), np.float32), nbytes=12)
            writer.end_step()
        writer.write_object(END_OF_TRAINING, b"")
        writer.close()

    thread = threading.Thread(target=produce)
    thread.start()
    trial.wait_for_steps([5], timeout=30)
    thread.join()
    np.testing.assert_array_equal(trial.tensor("Net_fc.weight").value(5), np.full(3, 5.0, np.float32))
    # Every listing after the first started after the last key already seen: no rescans.
    index_listings = [call for call in store.list_calls if call[0] == "index/"]
    assert index_listings[0][1] is None
    assert all(start_after is not None for _, start_after, _ in index_listings[1:])
    assert sum(count for _, _, count in index_listings) == 6  # each index file listed once
    trial.refresh()
    assert trial.loaded_all_steps
    with pytest.raises(NoMoreData):
        trial.wait_for_steps([99], timeout=5)


def test_wait_times_out_instead_of_hanging(tmp_path) -> None:
    write_steps(LocalStore(tmp_path), [(0, ModeKeys.TRAIN, 0)], end=False)
    trial = create_trial(tmp_path)
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match="did not arrive within 0.3 s"):
        trial.wait_for_steps([1], timeout=0.3)
    assert time.monotonic() - started < 5


def test_missing_collections_is_clear_and_bounded(tmp_path) -> None:
    with pytest.raises(MissingCollectionFiles, match="no collections file"):
        create_trial(tmp_path / "nothing", collection_wait_timeout=0.2)
    (tmp_path / "ended").mkdir()
    (tmp_path / "ended" / END_OF_TRAINING).write_bytes(b"")
    with pytest.raises(MissingCollectionFiles, match="training has ended"):
        create_trial(tmp_path / "ended", collection_wait_timeout=30)


def test_batched_read_is_one_read_per_event_file() -> None:
    inner = MemoryStore()
    write_steps(inner, [(0, ModeKeys.TRAIN, 0)])
    store = CountingStore(inner)
    trial = Trial(store)
    store.reads.clear()
    values = trial.tensor_values(["Net_fc.weight", "gradient/Net_fc.weight", "CrossEntropyLoss_output_0"], 0)
    assert set(values) == {"Net_fc.weight", "gradient/Net_fc.weight", "CrossEntropyLoss_output_0"}
    assert [key for key, _, _ in store.reads] == [event_key(0, "worker_0")]


def test_unknown_tensor_and_step_errors_say_what_is_missing(tmp_path) -> None:
    write_steps(LocalStore(tmp_path), [(0, ModeKeys.TRAIN, 0), (2, ModeKeys.TRAIN, 2)])
    trial = create_trial(tmp_path)
    with pytest.raises(TensorUnavailable, match="similar names.*Net_fc.weight"):
        trial.tensor("fc.weight")
    from trainguard.errors import InvalidWorker

    with pytest.raises(InvalidWorker, match="worker_7"):
        trial.tensor("Net_fc.weight").value(0, worker="worker_7")
    from trainguard.errors import StepUnavailable

    with pytest.raises(StepUnavailable, match="step 1 .* was not saved"):
        trial.tensor("Net_fc.weight").value(1)
    with pytest.raises(NoMoreData):
        trial.tensor("Net_fc.weight").value(50)


def test_corrupt_event_file_is_a_format_error_with_path_and_offset(tmp_path) -> None:
    write_steps(LocalStore(tmp_path), [(0, ModeKeys.TRAIN, 0)])
    event_file = tmp_path / event_key(0, "worker_0")
    data = bytearray(event_file.read_bytes())
    data[9] ^= 0xFF  # first record's length checksum
    event_file.write_bytes(bytes(data))
    trial = create_trial(tmp_path)
    names = trial.tensor_names()
    with pytest.raises(FormatError) as info:
        trial.tensor_values(names, 0)
    assert event_key(0, "worker_0") in str(info.value) and "at byte" in str(info.value)


def test_truncated_event_file_and_corrupt_index(tmp_path) -> None:
    write_steps(LocalStore(tmp_path), [(0, ModeKeys.TRAIN, 0), (1, ModeKeys.TRAIN, 1)])
    event_file = tmp_path / event_key(1, "worker_0")
    event_file.write_bytes(event_file.read_bytes()[:-10])
    index_file = next((tmp_path / "index").rglob("000000000000_worker_0.json"))
    index_file.write_text("{not json")
    trial = create_trial(tmp_path)
    # The corrupt index is skipped and reported; the rest of the run stays readable.
    assert trial.steps() == [1]
    assert trial._state.corrupt_index_files
    last = sorted(trial.tensor_names(), key=lambda n: trial._state.tensors[n][1]["worker_0"].entry.start)[-1]
    with pytest.raises(FormatError, match="file ends before"):
        trial.tensor(last).value(1)


def test_multi_worker_out_of_order_index_is_not_missed() -> None:
    store = MemoryStore()
    fast = StepWriter(store, "worker_0")
    fast.write_object(collections_key("worker_0"), CollectionManager.pytorch_defaults().render(2))
    fast.write_object(collections_key("worker_1"), CollectionManager.pytorch_defaults().render(2))
    for step in (0, 1):
        fast.begin_step(step, ModeKeys.TRAIN, step)
        fast.add_tensor("w", np.zeros(1, np.float32), nbytes=4)
        fast.end_step()
    fast.close()
    trial = Trial(store)
    assert trial.steps() == []  # worker_1 has written nothing: no step is complete
    assert trial.steps(show_incomplete_steps=True) == [0, 1]
    slow = StepWriter(store, "worker_1")
    for step in (0, 1):  # keys sort *before* worker_0's step 1 key that was already listed
        slow.begin_step(step, ModeKeys.TRAIN, step)
        slow.add_tensor("w", np.ones(1, np.float32), nbytes=4)
        slow.end_step()
    slow.close()
    assert trial.steps() == [0, 1]
    assert trial.tensor("w").workers(0) == ["worker_0", "worker_1"]
    np.testing.assert_array_equal(trial.tensor("w").value(0, worker="worker_1"), np.ones(1, np.float32))
