"""Batched reads: one whole-file read per step, arrays that view it, small tensors copied out."""

from __future__ import annotations

import numpy as np
import pytest

from tests.rules.synthetic import open_trial, write_run
from trainguard.errors import FormatError
from trainguard.modes import ModeKeys


def _run(tmp_path) -> tuple[str, dict[str, np.ndarray]]:
    values = {
        "big": np.arange(50_000, dtype=np.float32).reshape(500, 100),
        "half": np.linspace(-1, 1, 64).astype(np.float16),
        "flags": np.array([True, False, True]),
        "count": np.array([7], dtype=np.int64),
        "bytes": np.arange(256, dtype=np.uint8),
        "empty": np.zeros((0, 3), dtype=np.float64),
        "complex": np.array([1 + 2j, -3j], dtype=np.complex64),
    }
    return write_run(tmp_path / "run", {0: values, 1: values}), values


def test_batched_read_returns_exactly_what_was_written(tmp_path) -> None:
    path, written = _run(tmp_path)
    trial = open_trial(path)
    for step in (0, 1):
        read = trial.tensor_values(sorted(written), step)
        for name, expected in written.items():
            assert read[name].dtype == expected.dtype and read[name].shape == expected.shape, name
            assert read[name].tobytes() == expected.tobytes(), name
            assert not read[name].flags.writeable, name  # as decode_event's arrays always were
        single = trial.tensor("big").value(step)  # a one-tensor read reads just its record
        assert single.tobytes() == written["big"].tobytes()


def test_large_tensors_view_the_file_and_small_ones_do_not_pin_it(tmp_path) -> None:
    path, written = _run(tmp_path)
    read = open_trial(path).tensor_values(sorted(written), 0)
    big, small = read["big"], read["count"]

    def owner(array: np.ndarray) -> object:
        base = array
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        return base.obj if isinstance(base, memoryview) else base

    assert len(owner(big)) > big.nbytes  # a view of the whole event file: no copy
    assert len(owner(small)) < 200  # copied out: keeping it does not keep the file alive


def test_a_record_cut_short_names_the_file_and_offset(tmp_path) -> None:
    path, written = _run(tmp_path)
    trial = open_trial(path)
    event_file = next((tmp_path / "run" / "events").glob("*/000000000001_*.tfevents"))
    data = bytearray(event_file.read_bytes())
    location = trial._state.tensors["big"][1]
    start = next(iter(location.values())).entry.start
    data[start + 20] ^= 0xFF  # inside the big record's payload: its checksum is smdebug's constant,
    data[start + 8] ^= 0xFF  # so break the length checksum instead
    event_file.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="checksum") as info:
        trial.tensor_values(sorted(written), 1, ModeKeys.GLOBAL)
    assert info.value.offset == start
    event_file.write_bytes(bytes(data[: start + 100]))
    with pytest.raises(FormatError, match="file ends before"):
        trial.tensor_values(sorted(written), 1)


def test_selections_follow_a_growing_run(tmp_path) -> None:
    """tensor_names keeps selections between calls, but never past a new tensor or collection."""
    path = tmp_path / "run"
    write_run(path, {0: {"gradient/a": np.ones(2)}}, collections={"gradients": ["gradient/a"]}, finished=False)
    trial = open_trial(path)
    assert trial.tensor_names(collection="gradients") == ["gradient/a"]
    assert trial.tensor_names(regex="^gradient/") == ["gradient/a"]
    steps = {0: {"gradient/a": np.ones(2)}, 1: {"gradient/a": np.ones(2), "gradient/b": np.ones(2), "x": np.ones(1)}}
    write_run(path, steps, collections={"gradients": ["gradient/a", "gradient/b"]}, finished=True)
    trial.refresh(force=True)
    assert trial.tensor_names(collection="gradients") == ["gradient/a", "gradient/b"]
    assert trial.tensor_names(regex="^gradient/") == ["gradient/a", "gradient/b"]
    names = trial.tensor_names()
    names.append("changed by the caller")  # callers get their own list
    assert "changed by the caller" not in trial.tensor_names()
