"""Record framing and tensor encoding: golden bytes, every dtype, and corrupt input."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from trainguard.errors import FormatError
from trainguard.format.crc32c import MAGIC_FOOTER, _crc32c_python, crc32c, masked_crc32c
from trainguard.format.proto import event_pb2
from trainguard.format.record import frame, iter_records, parse_record
from trainguard.format.tensor_codec import DT_BFLOAT16, decode_event, encode_tensor_event
from trainguard.modes import ModeKeys

GOLDEN = Path(__file__).parent / "golden"


def test_crc32c_known_vectors() -> None:
    # RFC 3720 test vector and the empty string.
    assert crc32c(b"123456789") == 0xE3069283
    assert _crc32c_python(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
    assert MAGIC_FOOTER == 0x062DC0B3 == masked_crc32c(b"0x12345678")


def test_frame_layout_matches_smdebug() -> None:
    payload = b"hello"
    record = frame(payload)
    assert record[:8] == struct.pack("<Q", 5)
    assert record[8:12] == struct.pack("<I", masked_crc32c(record[:8]))
    assert record[12:17] == payload
    assert record[17:] == b"\xb3\xc0\x2d\x06"  # smdebug's constant footer, bytes on disk
    real = frame(payload, real_checksum=True)
    assert real[17:] == struct.pack("<I", masked_crc32c(payload))


def test_reader_accepts_both_footers_and_rejects_others() -> None:
    for record in (frame(b"abc"), frame(b"abc", real_checksum=True)):
        payload, end = parse_record(record, 0, "f")
        assert bytes(payload) == b"abc" and end == len(record)
    bad = bytearray(frame(b"abc"))
    bad[-1] ^= 0xFF
    with pytest.raises(FormatError, match="payload checksum"):
        parse_record(bytes(bad), 0, "f")


def test_corrupt_and_truncated_records_name_file_and_offset() -> None:
    data = frame(b"first") + frame(b"second")
    second = len(frame(b"first"))
    corrupt = bytearray(data)
    corrupt[second + 9] ^= 0x01  # inside the second record's length checksum
    with pytest.raises(FormatError) as info:
        list(iter_records(bytes(corrupt), "events/x.tfevents"))
    assert info.value.path == "events/x.tfevents" and info.value.offset == second
    assert f"events/x.tfevents at byte {second}:" in str(info.value)
    with pytest.raises(FormatError, match="truncated record"):
        list(iter_records(data[:-3], "f"))
    with pytest.raises(FormatError, match="truncated record header"):
        list(iter_records(data[: second + 5], "f"))


DTYPES = [
    np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
    np.uint8, np.uint16, np.uint32, np.uint64, np.bool_, np.complex64, np.complex128,
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (1,), (3, 4), (0,), (2, 0, 3)])
def test_every_dtype_round_trips(dtype: type, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    if np.dtype(dtype).kind == "b":
        array = rng.integers(0, 2, size=shape).astype(dtype)
    elif np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        array = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    elif np.dtype(dtype).kind == "c":
        array = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    else:
        array = rng.standard_normal(shape).astype(dtype)
    encoded = encode_tensor_event("t", array, step=7, mode=ModeKeys.EVAL, mode_step=3, wall_time=1.5)
    decoded = decode_event(encoded.to_bytes())
    assert decoded.value.dtype == array.dtype
    assert decoded.value.shape == array.shape
    np.testing.assert_array_equal(decoded.value, array)
    assert (decoded.tag, decoded.step, decoded.mode, decoded.mode_step) == ("t", 7, ModeKeys.EVAL, 3)


def test_int8_negative_values_survive() -> None:
    # smdebug decoded DT_INT8 as uint8: -1 came back as 255.
    array = np.array([-128, -1, 0, 127], dtype=np.int8)
    decoded = decode_event(encode_tensor_event("t", array, step=0, mode=ModeKeys.TRAIN, mode_step=0, wall_time=0).to_bytes())
    np.testing.assert_array_equal(decoded.value, array)


def test_bfloat16_bits_decode_exactly_as_float32() -> None:
    values = np.array([1.0, -2.5, 3.140625, 0.0], dtype=np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)  # exact: these values fit bf16
    encoded = encode_tensor_event("b", bits, step=0, mode=ModeKeys.TRAIN, mode_step=0, wall_time=0, proto_dtype=DT_BFLOAT16)
    event = event_pb2.Event.FromString(encoded.to_bytes())
    assert event.summary.value[0].tensor.dtype == DT_BFLOAT16
    np.testing.assert_array_equal(decode_event(encoded.to_bytes()).value, values)


def test_strings_are_one_dimensional_string_val() -> None:
    array = np.array(["a", "héllo", ""])
    encoded = encode_tensor_event("s", array, step=1, mode=ModeKeys.TRAIN, mode_step=1, wall_time=0)
    event = event_pb2.Event.FromString(encoded.to_bytes())
    assert event.summary.value[0].tensor.dtype == 0  # smdebug leaves strings at DT_INVALID
    assert list(decode_event(encoded.to_bytes()).value) == ["a", "héllo", ""]
    with pytest.raises(TypeError):
        encode_tensor_event("s", np.array([["a"]]), step=1, mode=ModeKeys.TRAIN, mode_step=1, wall_time=0)


def test_hand_encoding_equals_protobuf_message() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    encoded = encode_tensor_event("Net_fc.weight", array, step=500, mode=ModeKeys.TRAIN, mode_step=250, wall_time=12.25)
    expected = event_pb2.Event(wall_time=12.25, step=500)
    value = expected.summary.value.add(tag="Net_fc.weight")
    value.metadata.plugin_data.add(plugin_name="mode_step", content=b"250")
    value.metadata.plugin_data.add(plugin_name="mode", content=b"1")
    value.tensor.dtype = 1
    value.tensor.tensor_shape.dim.add(size=3)
    value.tensor.tensor_shape.dim.add(size=4)
    value.tensor.tensor_content = array.tobytes()
    assert event_pb2.Event.FromString(encoded.to_bytes()) == expected


def test_typed_value_fields_from_tensorflow_writers() -> None:
    event = event_pb2.Event(step=1)
    value = event.summary.value.add(tag="tf")
    value.tensor.dtype = 1
    value.tensor.tensor_shape.dim.add(size=3)
    value.tensor.float_val.append(2.5)  # TensorFlow's constant-tensor shorthand
    np.testing.assert_array_equal(decode_event(event.SerializeToString()).value, np.full(3, 2.5, np.float32))


def test_garbage_payload_is_a_format_error() -> None:
    with pytest.raises(FormatError):
        decode_event(b"\xff\xff\xff\xff", "events/e.tfevents", 40)
    with pytest.raises(FormatError, match="not a tensor"):
        event = event_pb2.Event(step=1)
        event.summary.value.add(tag="x", simple_value=1.0)
        decode_event(event.SerializeToString())


def test_golden_record_bytes() -> None:
    """The exact bytes of one record: any change to the format shows up here."""
    array = np.array([[1.0, -2.0], [0.5, 4.0]], dtype=np.float32)
    encoded = encode_tensor_event("Net_fc1.weight", array, step=10, mode=ModeKeys.TRAIN, mode_step=10, wall_time=1700000000.0)
    record = frame(encoded.to_bytes())
    golden = GOLDEN / "record_Net_fc1.weight.bin"
    if not golden.exists():  # pragma: no cover - regenerate by deleting the file
        golden.parent.mkdir(exist_ok=True)
        golden.write_bytes(record)
    assert record == golden.read_bytes()


@pytest.mark.parametrize("seed", range(5))
def test_batched_scalar_events_are_byte_identical_to_the_general_encoder(seed):
    from trainguard.format.tensor_codec import encode_scalar_events

    rng = np.random.default_rng(seed)
    tags = [f"layer{i}/weight_{'x' * int(rng.integers(0, 200))}" for i in range(20)]
    values = rng.normal(size=20) * 10.0 ** rng.integers(-300, 300, size=20)
    values[0], values[1] = np.nan, -np.inf
    mode = list(ModeKeys)[seed % 4]
    step, mode_step = int(rng.integers(0, 2**40)), int(rng.integers(0, 1000))
    batched = encode_scalar_events(tags, values, step=step, mode=mode, mode_step=mode_step, wall_time=1.25e9)
    for tag, value, payload in zip(tags, values, batched, strict=True):
        single = encode_tensor_event(tag, np.array(value), step=step, mode=mode, mode_step=mode_step, wall_time=1.25e9)
        assert payload == bytes(single.prefix) + bytes(single.content)
