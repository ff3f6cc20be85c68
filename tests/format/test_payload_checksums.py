"""The run-level promise of payload checksums, and what a reader makes of an entry without one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trainguard.errors import ChecksumMissing
from trainguard.format.index import (
    PAYLOAD_CHECKSUMS_META,
    IndexEntry,
    StepIndex,
    declares_payload_checksums,
    parse_index,
    render_index,
)
from trainguard.format.record import frame
from trainguard.format.tensor_codec import encode_tensor_event
from trainguard.modes import ModeKeys
from trainguard.trial.records import decode_record


def test_the_declaration_is_one_meta_key_smdebug_ignores() -> None:
    assert declares_payload_checksums({"num_workers": 1, **PAYLOAD_CHECKSUMS_META})
    assert not declares_payload_checksums({"num_workers": 1})  # smdebug's collections files
    assert not declares_payload_checksums({"payload_checksums": "md5"})


def test_checksums_survive_render_and_parse_and_may_be_absent() -> None:
    entries = [IndexEntry("a", 0, 20, 7), IndexEntry("b", 20, 20)]
    index = StepIndex(3, "worker_0", ModeKeys.TRAIN, 3, "events/x", entries)
    document = json.loads(render_index(index))
    assert [entry.get("crc32") for entry in document["tensor_payload"]] == [7, None]
    parsed = parse_index(render_index(index), step=3, worker="worker_0", path="p")
    assert [entry.checksum for entry in parsed.tensors] == [7, None]


def _record() -> bytes:
    encoded = encode_tensor_event("loss", np.array(0.0018, np.float32), step=0, mode=ModeKeys.TRAIN, mode_step=0,
                                  wall_time=0.0)  # fmt: skip
    return frame(encoded.prefix + bytes(encoded.content))


def test_a_missing_checksum_is_refused_only_where_the_run_promised_one() -> None:
    record = memoryview(_record())
    assert decode_record(record, 0, len(record), 0, "p").item() == pytest.approx(0.0018)  # smdebug's runs
    with pytest.raises(ChecksumMissing, match="no crc32"):
        decode_record(record, 0, len(record), 0, "p", None, checksum_required=True)
