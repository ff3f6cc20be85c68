"""Tensor events: numpy array <-> serialized ``Event`` payload. Pure functions, no I/O.

The write path encodes the protobuf wire format by hand so that a tensor's bytes are never
copied into a protobuf message: the encoded event is a small prefix followed by the array's own
buffer, and the writer hands both to the file as they are. Fields are the ones smdebug writes
(Event.wall_time/step/summary, Summary.Value.tag/metadata/tensor, TensorProto dtype/shape/
tensor_content or string_val). The read path parses with the generated protobuf classes, which
also proves the hand encoding (tests compare the two).
"""

from __future__ import annotations

import struct
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainguard.errors import FormatError
from trainguard.format.proto import event_pb2
from trainguard.modes import ModeKeys

__all__ = ["DecodedTensor", "EncodedTensor", "decode_event", "encode_tensor_event", "proto_dtype_of", "saved_dtype"]

# numpy dtype -> TensorFlow DataType number
_WRITE_DTYPES: dict[np.dtype[Any], int] = {
    np.dtype(np.float16): 19,
    np.dtype(np.float32): 1,
    np.dtype(np.float64): 2,
    np.dtype(np.int8): 6,
    np.dtype(np.int16): 5,
    np.dtype(np.int32): 3,
    np.dtype(np.int64): 9,
    np.dtype(np.uint8): 4,
    np.dtype(np.uint16): 17,
    np.dtype(np.uint32): 22,
    np.dtype(np.uint64): 23,
    np.dtype(np.complex64): 8,
    np.dtype(np.complex128): 18,
    np.dtype(np.bool_): 10,
}
DT_BFLOAT16 = 14
_READ_DTYPES: dict[int, np.dtype[Any]] = {number: dtype for dtype, number in _WRITE_DTYPES.items()}
_STRING_DTYPES = (0, 7)  # smdebug leaves strings at DT_INVALID; TensorFlow says DT_STRING


def proto_dtype_of(array: np.ndarray) -> int:
    """The DataType number for ``array``; 0 for strings. Raises TypeError for the unsupported."""
    dtype = array.dtype
    if dtype in _WRITE_DTYPES:
        return _WRITE_DTYPES[dtype]
    if dtype.kind in "USO":
        return 0
    if dtype.name == "bfloat16":  # ml_dtypes' bfloat16, when the caller has it
        return DT_BFLOAT16
    raise TypeError(f"cannot save a tensor of dtype {dtype}: convert it to a standard numeric dtype first")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint((field << 3) | wire_type)


def _length_delimited(field: int, body: bytes) -> bytes:
    return _key(field, 2) + _varint(len(body)) + body


def _header_of_length_delimited(field: int, length: int) -> bytes:
    return _key(field, 2) + _varint(length)


@dataclass(frozen=True)
class EncodedTensor:
    """An encoded event: ``prefix`` followed by ``content`` (the array's buffer, not copied)."""

    prefix: bytes
    content: memoryview

    @property
    def length(self) -> int:
        return len(self.prefix) + self.content.nbytes

    def to_bytes(self) -> bytes:
        return self.prefix + self.content.tobytes()


_EMPTY = memoryview(b"")


def encode_tensor_event(
    tag: str,
    array: np.ndarray,
    *,
    step: int,
    mode: ModeKeys,
    mode_step: int,
    wall_time: float,
    proto_dtype: int | None = None,
) -> EncodedTensor:
    """Encode one tensor as an smdebug tensor event.

    ``proto_dtype`` overrides the DataType, for raw buffers whose numpy dtype only carries the
    bits (bfloat16 travels as uint16 from frameworks whose numpy has no bfloat16).
    """
    dtype_number = proto_dtype_of(array) if proto_dtype is None else proto_dtype
    shape = b"".join(_length_delimited(2, _key(1, 0) + _varint(int(size))) for size in array.shape)
    tensor_fields = _length_delimited(2, shape)
    if dtype_number:
        tensor_fields = _key(1, 0) + _varint(dtype_number) + tensor_fields
    if array.dtype.kind in "USO":
        if array.ndim != 1:
            raise TypeError(f"string tensors must be 1-D, got shape {array.shape}")
        strings = b"".join(_length_delimited(8, str(item).encode("utf-8")) for item in array.tolist())
        tensor_fields += strings
        content = _EMPTY
    else:
        contiguous = np.ascontiguousarray(array)
        if contiguous.dtype.byteorder == ">":
            contiguous = contiguous.astype(contiguous.dtype.newbyteorder("<"))
        content = contiguous.data.cast("B") if contiguous.size else _EMPTY
        if content.nbytes:
            tensor_fields += _header_of_length_delimited(4, content.nbytes)
    metadata = _length_delimited(
        1, _length_delimited(1, b"mode_step") + _length_delimited(2, str(mode_step).encode())
    ) + _length_delimited(1, _length_delimited(1, b"mode") + _length_delimited(2, str(mode.value).encode()))
    tensor_length = len(tensor_fields) + content.nbytes
    value_fields = (
        _length_delimited(1, tag.encode("utf-8"))
        + _length_delimited(9, metadata)
        + _header_of_length_delimited(8, tensor_length)
        + tensor_fields
    )
    value_length = len(value_fields) + content.nbytes
    summary_fields = _header_of_length_delimited(1, value_length) + value_fields
    summary_length = len(summary_fields) + content.nbytes
    prefix = (
        _key(1, 1)
        + struct.pack("<d", wall_time)
        + _key(2, 0)
        + _varint(step)
        + _header_of_length_delimited(5, summary_length)
        + summary_fields
    )
    return EncodedTensor(prefix=prefix, content=content)


# A float64 scalar's TensorProto fields: dtype DT_DOUBLE, empty shape, 8 bytes of content.
_SCALAR_TENSOR_FIELDS = _key(1, 0) + _varint(2) + _length_delimited(2, b"") + _header_of_length_delimited(4, 8)
_SCALAR_TENSOR_HEADER = _header_of_length_delimited(8, len(_SCALAR_TENSOR_FIELDS) + 8) + _SCALAR_TENSOR_FIELDS


# Pieces that repeat across the steps of a run, encoded once: a Value's tag field per tensor
# name, and length headers per (field, length). Bounded: cleared when a run has very many names.
_TAG_FIELDS: dict[str, bytes] = {}
_LENGTH_HEADERS: dict[tuple[int, int], bytes] = {}
_MAX_CACHED_TAGS = 65536


def _length_header(field: int, length: int) -> bytes:
    header = _LENGTH_HEADERS.get((field, length))
    if header is None:
        header = _LENGTH_HEADERS[(field, length)] = _header_of_length_delimited(field, length)
    return header


def encode_scalar_events(
    tags: Sequence[str], values: np.ndarray, *, step: int, mode: ModeKeys, mode_step: int, wall_time: float
) -> list[bytes]:
    """Many float64 scalars of one step as event payloads, byte-identical to
    :func:`encode_tensor_event` of ``np.float64(value)`` each.

    Reductions are many tiny records per step; building each from cached pieces instead of
    through the general encoder keeps the writer thread's Python work (and so its hold on the
    GIL, which the training thread waits for) small.
    """
    metadata = _length_delimited(
        9,
        _length_delimited(1, _length_delimited(1, b"mode_step") + _length_delimited(2, str(mode_step).encode()))
        + _length_delimited(1, _length_delimited(1, b"mode") + _length_delimited(2, str(mode.value).encode())),
    )
    event_head = _key(1, 1) + struct.pack("<d", wall_time) + _key(2, 0) + _varint(step)
    packed = np.ascontiguousarray(values, dtype="<f8").tobytes()
    after_tag = metadata + _SCALAR_TENSOR_HEADER
    if len(_TAG_FIELDS) > _MAX_CACHED_TAGS:
        _TAG_FIELDS.clear()
    payloads = []
    for index, tag in enumerate(tags):
        tag_field = _TAG_FIELDS.get(tag)
        if tag_field is None:
            tag_field = _TAG_FIELDS[tag] = _length_delimited(1, tag.encode("utf-8"))
        value_length = len(tag_field) + len(after_tag) + 8
        value_header = _length_header(1, value_length)
        summary_header = _length_header(5, len(value_header) + value_length)
        value = packed[8 * index : 8 * index + 8]
        payloads.append(b"".join((event_head, summary_header, value_header, tag_field, after_tag, value)))
    return payloads


@dataclass
class DecodedTensor:
    tag: str
    value: np.ndarray
    step: int
    mode: ModeKeys
    mode_step: int
    wall_time: float


def _array_from_typed_fields(tensor: Any, dtype_number: int, shape: tuple[int, ...]) -> np.ndarray:
    """TensorFlow writers may use the typed repeated fields instead of tensor_content."""
    count = int(np.prod(shape)) if shape else 1
    if dtype_number == 19:
        values = np.array(tensor.half_val, dtype=np.uint16).view(np.float16)
    elif dtype_number == DT_BFLOAT16:
        values = _bfloat16_to_float32(np.array(tensor.half_val, dtype=np.uint16))
    elif dtype_number == 1:
        values = np.array(tensor.float_val, dtype=np.float32)
    elif dtype_number == 2:
        values = np.array(tensor.double_val, dtype=np.float64)
    elif dtype_number == 9:
        values = np.array(tensor.int64_val, dtype=np.int64)
    elif dtype_number == 10:
        values = np.array(tensor.bool_val, dtype=np.bool_)
    elif dtype_number == 8:
        values = np.array(tensor.scomplex_val, dtype=np.float32).view(np.complex64)
    elif dtype_number == 18:
        values = np.array(tensor.dcomplex_val, dtype=np.float64).view(np.complex128)
    else:
        values = np.array(tensor.int_val, dtype=np.int64).astype(_READ_DTYPES[dtype_number])
    if values.size == 1 and count > 1:  # TensorFlow stores a constant tensor as one value
        values = np.full(count, values[0], dtype=values.dtype)
    return values.reshape(shape)


def _bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    # bfloat16 is the upper half of a float32: widening is exact.
    return (bits.astype(np.uint32) << 16).view(np.float32)


# Arrays decoded from bfloat16 (by id, while they live): numpy has no bfloat16, so they are
# float32, and this is how a reader still learns the dtype the user trained in.
_WIDENED_BFLOAT16: dict[int, weakref.ref[np.ndarray]] = {}


def _mark_bfloat16(array: np.ndarray) -> np.ndarray:
    key = id(array)

    def forget(_gone: weakref.ref[np.ndarray]) -> None:
        _WIDENED_BFLOAT16.pop(key, None)

    _WIDENED_BFLOAT16[key] = weakref.ref(array, forget)
    return array


def saved_dtype(array: np.ndarray) -> str:
    """The dtype ``array`` was saved in: ``"bfloat16"`` for a tensor trained and saved in
    bfloat16 (read back as exact float32 values), else the array's own dtype name."""
    ref = _WIDENED_BFLOAT16.get(id(array))
    if ref is not None and ref() is array:
        return "bfloat16"
    return np.asarray(array).dtype.name


def decode_event(payload: bytes | memoryview, path: str = "<memory>", offset: int = 0) -> DecodedTensor:
    """Decode one tensor event. bfloat16 comes back as float32 (exact); strings as a str array."""
    event = event_pb2.Event()
    try:
        event.ParseFromString(bytes(payload))
    except Exception as error:  # protobuf raises DecodeError or RuntimeWarning-like errors
        raise FormatError(path, offset, f"event does not parse as protobuf: {error}") from None
    if not event.HasField("summary") or not event.summary.value:
        raise FormatError(path, offset, "event carries no summary value")
    value = event.summary.value[0]
    if not value.HasField("tensor"):
        raise FormatError(path, offset, f"value {value.tag!r} is not a tensor")
    mode = ModeKeys.GLOBAL
    mode_step = event.step
    for plugin in value.metadata.plugin_data:
        content = plugin.content.decode("utf-8", "replace")
        if plugin.plugin_name == "mode":
            mode = ModeKeys(int(content))
        elif plugin.plugin_name == "mode_step":
            mode_step = int(content)
    tensor = value.tensor
    shape = tuple(int(dim.size) for dim in tensor.tensor_shape.dim)
    dtype_number = int(tensor.dtype)
    if dtype_number in _STRING_DTYPES:
        array: np.ndarray = np.array([item.decode("utf-8") for item in tensor.string_val])
    elif dtype_number == DT_BFLOAT16:
        if tensor.tensor_content:
            array = _bfloat16_to_float32(np.frombuffer(tensor.tensor_content, dtype="<u2")).reshape(shape)
        else:
            array = _array_from_typed_fields(tensor, dtype_number, shape)
    elif dtype_number in _READ_DTYPES:
        dtype = _READ_DTYPES[dtype_number]
        if tensor.tensor_content or 0 in shape:
            array = np.frombuffer(tensor.tensor_content, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False)
            array = array.reshape(shape)
        else:
            array = _array_from_typed_fields(tensor, dtype_number, shape)
    else:
        raise FormatError(path, offset, f"tensor {value.tag!r} has unsupported DataType {dtype_number}")
    if dtype_number == DT_BFLOAT16:
        _mark_bfloat16(array)
    return DecodedTensor(
        tag=value.tag, value=array, step=event.step, mode=mode, mode_step=mode_step, wall_time=event.wall_time
    )
