"""A flipped payload byte is an error on read, never a silently wrong value.

smdebug's record footer is a constant (smdebug 1.0.34 rejects anything else there), so the
payload itself had no checksum: trainguard writes the payload's CRC-32 into the index entry
(extra key ``crc32``) and the reader verifies it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.trial.test_trial_live import write_steps
from trainguard.errors import FormatError
from trainguard.format.layout import event_key
from trainguard.modes import ModeKeys
from trainguard.storage import LocalStore
from trainguard.trial import create_trial


def _flip_last_payload_byte_of(tmp_path, name: str) -> None:  # noqa: ANN001
    index_file = next((tmp_path / "index").rglob("000000000000_worker_0.json"))
    entry = next(e for e in json.loads(index_file.read_text())["tensor_payload"] if e["tensorname"] == name)
    event_file = tmp_path / event_key(0, "worker_0")
    data = bytearray(event_file.read_bytes())
    data[entry["start_idx"] + entry["length"] - 5] ^= 0x01  # last payload byte (the footer is 4 bytes)
    event_file.write_bytes(bytes(data))


def test_every_index_entry_carries_the_payload_crc(tmp_path) -> None:
    write_steps(LocalStore(tmp_path), [(0, ModeKeys.TRAIN, 0)])
    index_file = next((tmp_path / "index").rglob("000000000000_worker_0.json"))
    entries = json.loads(index_file.read_text())["tensor_payload"]
    assert entries and all(isinstance(e["crc32"], int) and 0 <= e["crc32"] < 2**32 for e in entries)


@pytest.mark.parametrize("name", ["Net_fc.weight", "CrossEntropyLoss_output_0"])
def test_flipped_payload_byte_is_a_format_error(tmp_path, name: str) -> None:
    write_steps(LocalStore(tmp_path), [(0, ModeKeys.TRAIN, 0)])
    trial = create_trial(tmp_path)
    before = trial.tensor(name).value(0)
    _flip_last_payload_byte_of(tmp_path, name)
    fresh = create_trial(tmp_path)
    with pytest.raises(FormatError, match="checksum in the index"):
        fresh.tensor(name).value(0)
    assert isinstance(before, np.ndarray)  # the intact file read fine


def test_index_without_checksums_still_reads(tmp_path) -> None:
    """Runs written by smdebug (no crc32 key) read as before."""
    write_steps(LocalStore(tmp_path), [(0, ModeKeys.TRAIN, 0)])
    index_file = next((tmp_path / "index").rglob("000000000000_worker_0.json"))
    document = json.loads(index_file.read_text())
    for entry in document["tensor_payload"]:
        del entry["crc32"]
    index_file.write_text(json.dumps(document))
    assert create_trial(tmp_path).tensor("Net_fc.weight").value(0).shape == (2, 3)
