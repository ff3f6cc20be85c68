"""The hand decoder returns exactly what decode_event returns, for every dtype and every odd case."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from trainguard.format.fast_decode import _Unusual, decode_tensor_event, parse_plain_event
from trainguard.format.proto import event_pb2
from trainguard.format.record import frame, iter_records
from trainguard.format.tensor_codec import DT_BFLOAT16, decode_event, encode_scalar_events, encode_tensor_event
from trainguard.modes import ModeKeys

INTEROP = Path(__file__).resolve().parents[1] / "interop"


def assert_same(payload: bytes, path: str = "f", offset: int = 0) -> np.ndarray:
    expected = decode_event(payload, path, offset)
    fast = decode_tensor_event(memoryview(payload), path, offset)
    assert (fast.tag, fast.step, fast.mode, fast.mode_step) == (
        expected.tag,
        expected.step,
        expected.mode,
        expected.mode_step,
    )
    assert np.float64(fast.wall_time).tobytes() == np.float64(expected.wall_time).tobytes()
    assert fast.value.dtype == expected.value.dtype
    assert fast.value.shape == expected.value.shape
    assert fast.value.tobytes() == expected.value.tobytes()
    assert fast.value.flags.writeable == expected.value.flags.writeable
    return fast.value


def encoded(array: np.ndarray, **kwargs) -> bytes:  # type: ignore[no-untyped-def]
    options = {"step": 7, "mode": ModeKeys.TRAIN, "mode_step": 3, "wall_time": 1234.5678, **kwargs}
    return encode_tensor_event("layer/w:0", array, **options).to_bytes()


NUMERIC = [
    np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
    np.uint8, np.uint16, np.uint32, np.uint64, np.complex64, np.complex128, np.bool_,
]  # fmt: skip


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("shape", [(), (1,), (5,), (3, 4), (2, 0, 3), (0,)])
def test_every_dtype_and_shape_matches_decode_event(dtype, shape) -> None:
    rng = np.random.default_rng(0)
    array = (rng.standard_normal(shape) * 50).astype(dtype)
    value = assert_same(encoded(array))
    np.testing.assert_array_equal(value, array)


def test_non_finite_and_extreme_values_keep_their_bits() -> None:
    for dtype in (np.float16, np.float32, np.float64):
        info = np.finfo(dtype)
        array = np.array([np.nan, np.inf, -np.inf, -0.0, info.max, info.tiny, info.smallest_subnormal], dtype=dtype)
        assert_same(encoded(array))
    for dtype in (np.int64, np.uint64, np.int8):
        info = np.iinfo(dtype)
        assert_same(encoded(np.array([info.min, info.max, 0], dtype=dtype)))


def test_bfloat16_widens_like_decode_event() -> None:
    bits = np.array([0x3F80, 0xC000, 0x7F80, 0x7FC1, 0x0001], dtype=np.uint16)
    value = assert_same(encoded(bits.reshape(5, 1), proto_dtype=DT_BFLOAT16))
    assert value.dtype == np.float32 and value[0, 0] == 1.0 and value[1, 0] == -2.0


def test_steps_modes_and_large_step_numbers() -> None:
    for mode in ModeKeys:
        for step, mode_step in ((0, 0), (1500, 2), (2**40 + 3, 2**33)):
            assert_same(encoded(np.arange(3.0), step=step, mode=mode, mode_step=mode_step))


def test_scalar_batches_from_the_reduction_writer() -> None:
    tags = ["smdebug/reductions/mean/a", "smdebug/reductions/abs_max/β"]
    values = np.array([1.5, -2.25])
    payloads = encode_scalar_events(tags, values, step=9, mode=ModeKeys.EVAL, mode_step=4, wall_time=3.0)
    for tag, payload in zip(tags, payloads, strict=True):
        assert parse_plain_event(payload)[0] == tag
        assert_same(payload)


def test_zero_copy_view_of_the_buffer() -> None:
    array = np.arange(1000, dtype=np.float32)
    payload = encoded(array)
    value = decode_tensor_event(payload).value
    assert np.shares_memory(value, np.frombuffer(payload, dtype=np.uint8))
    # a writable buffer still gives a read-only array: rules share what they read
    assert not decode_tensor_event(bytearray(payload)).value.flags.writeable


def _proto_event(build) -> bytes:  # type: ignore[no-untyped-def]
    event = event_pb2.Event(wall_time=1.0, step=4)
    value = event.summary.value.add(tag="t")
    build(event, value)
    return event.SerializeToString()


def test_strings_and_typed_fields_fall_back_to_protobuf() -> None:
    def strings(event, value) -> None:  # type: ignore[no-untyped-def]
        value.tensor.dtype = 7
        value.tensor.tensor_shape.dim.add(size=2)
        value.tensor.string_val.extend([b"ab", "é".encode()])

    def floats(event, value) -> None:  # type: ignore[no-untyped-def]
        value.tensor.dtype = 1
        value.tensor.tensor_shape.dim.add(size=3)
        value.tensor.float_val.extend([1.0, 2.0, 3.0])

    def constant(event, value) -> None:  # type: ignore[no-untyped-def]
        value.tensor.dtype = 9
        value.tensor.tensor_shape.dim.add(size=4)
        value.tensor.int64_val.append(-5)

    def bfloat_half_val(event, value) -> None:  # type: ignore[no-untyped-def]
        value.tensor.dtype = DT_BFLOAT16
        value.tensor.tensor_shape.dim.add(size=2)
        value.tensor.half_val.extend([0x3F80, 0x4000])

    for build in (strings, floats, constant, bfloat_half_val):
        payload = _proto_event(build)
        with pytest.raises(_Unusual):
            parse_plain_event(payload)
        assert_same(payload)
    assert list(decode_tensor_event(_proto_event(strings)).value) == ["ab", "é"]


def test_protobuf_override_rules_are_kept() -> None:
    # Fields repeated in the payload: scalars and bytes take the last value, as protobuf does.
    base = encoded(np.arange(4, dtype=np.int32))
    extra_step = bytes([0x10, 0x2A])  # field 2 (step) = 42, appended after the summary
    assert decode_tensor_event(base + extra_step).step == decode_event(base + extra_step).step == 42
    # A second summary would be merged by protobuf: the hand decoder must defer to it.
    twice = base + base[base.index(b"\x2a") :]
    with pytest.raises(_Unusual):
        parse_plain_event(twice)
    assert decode_tensor_event(twice).value.shape == decode_event(twice).value.shape


def test_malformed_payloads_fail_exactly_as_decode_event() -> None:
    good = encoded(np.arange(6, dtype=np.float64).reshape(2, 3))
    cases = [good[:-3], good[:10], b"\xff" * 12, good + b"\x07", b""]
    # content that does not fill the shape: decode_event raises ValueError from numpy
    cases.append(encoded(np.arange(6, dtype=np.float32)).replace(bytes([0x08, 0x06]), bytes([0x08, 0x07]), 1))
    for payload in cases:
        try:
            expected = decode_event(payload, "events/x", 12)
        except Exception as error:  # noqa: BLE001 - the same type and text is the assertion
            with pytest.raises(type(error)) as info:
                decode_tensor_event(payload, "events/x", 12)
            assert str(info.value) == str(error)
        else:
            assert decode_tensor_event(payload, "events/x", 12).value.tobytes() == expected.value.tobytes()


def test_invalid_mode_metadata_raises_like_decode_event() -> None:
    good_mode = b"mode\x12\x01" + str(ModeKeys.EVAL.value).encode()
    payload = encoded(np.arange(2.0), mode=ModeKeys.EVAL).replace(good_mode, b"mode\x12\x019")  # no mode 9
    with pytest.raises(ValueError) as expected:
        decode_event(payload)
    with pytest.raises(ValueError) as fast:
        decode_tensor_event(payload)
    assert str(fast.value) == str(expected.value)


def test_every_record_of_a_trainguard_pytorch_run(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    import trainguard.pytorch as tg

    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    hook = tg.Hook(str(tmp_path), save_config=tg.SaveConfig(save_interval=1), save_all=True)
    hook.register_module(model)
    loss_fn = torch.nn.CrossEntropyLoss()
    hook.register_loss(loss_fn)
    for _ in range(3):
        loss_fn(model(torch.randn(4, 6)), torch.tensor([0, 1, 1, 0])).backward()
    hook.close()
    files = sorted(tmp_path.glob("events/*/*.tfevents"))
    assert files
    checked = 0
    for file in files:
        data = file.read_bytes()
        for offset, payload in iter_records(data, str(file)):
            assert_same(bytes(payload), str(file), offset)
            checked += 1
    assert checked > 20


def test_every_record_smdebug_writes(tmp_path) -> None:
    """Bytes from smdebug 1.0.34's own serializer, every dtype it writes (needs its cached venv)."""
    if os.environ.get("TRAINGUARD_SKIP_SMDEBUG") == "1":
        pytest.skip("TRAINGUARD_SKIP_SMDEBUG=1")
    sys.path.insert(0, str(INTEROP))
    from smdebug_env import ensure_smdebug_venv, run_smdebug_script

    ensure_smdebug_venv()
    run_dir = tmp_path / "run"
    run_smdebug_script("write_raw_smdebug_events.py", str(run_dir), str(tmp_path / "expected.json"))
    fallbacks = checked = 0
    for file in sorted(run_dir.glob("events/*/*.tfevents")):
        data = file.read_bytes()
        for offset, payload in iter_records(data, str(file)):
            try:
                parse_plain_event(payload)
            except _Unusual:
                fallbacks += 1  # smdebug's strings
            assert_same(bytes(payload), str(file), offset)
            checked += 1
    assert checked > 20 and fallbacks < checked


def test_framed_records_decode_from_a_shared_file_buffer() -> None:
    arrays = [np.arange(n, dtype=np.float32) * n for n in (1, 50, 7)]
    data = b"".join(frame(encoded(array)) for array in arrays)
    values = [decode_tensor_event(payload).value for _, payload in iter_records(data, "f")]
    for array, value in zip(arrays, values, strict=True):
        np.testing.assert_array_equal(value, array)
