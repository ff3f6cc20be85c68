"""A fast read path for tensor events: the protobuf wire format parsed by hand, no copies.

:func:`trainguard.format.tensor_codec.decode_event` parses with the generated protobuf classes:
the payload is copied into ``bytes``, then protobuf copies ``tensor_content`` again, for every
tensor of every step. Rules that follow a run read every tensor of every step, and those copies
were most of their read time. This module walks the few fields a tensor event has (Event →
Summary → Value → TensorProto) over a memoryview and hands the ``tensor_content`` slice to
``np.frombuffer``: the array shares the buffer that was read from the file.

It accepts only the plain shape of a tensor event: the one written by trainguard's and smdebug's
hooks (every field at most once where protobuf would merge or override, no typed repeated
values, no strings). Anything else — strings, ``float_val`` and the other typed fields,
unexpected or repeated fields, malformed bytes — goes to ``decode_event``, so results (and
errors) are the same as that function's, value for value and byte for byte.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from trainguard.format.tensor_codec import (
    _READ_DTYPES,
    DT_BFLOAT16,
    DecodedTensor,
    _bfloat16_to_float32,
    _mark_bfloat16,
    decode_event,
)
from trainguard.modes import ModeKeys

__all__ = ["decode_tensor_event", "parse_plain_event"]

_DOUBLE = struct.Struct("<d")
_INT64_SPAN = 1 << 64
_INT64_MAX = (1 << 63) - 1


class _Unusual(Exception):
    """The payload is not a plain tensor event: let the protobuf decoder handle it."""


def _varint(data: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Unusual
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(data: memoryview, pos: int, end: int) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field of one message, in order: a
    length-delimited value is its (start, end) span, a varint its number, a fixed64 the start
    of its 8 bytes. One list per message: cheaper than a generator for these few fields."""
    fields: list[tuple[int, int, Any]] = []
    append = fields.append
    while pos < end:
        key = data[pos]  # keys and most values here are one-byte varints: decode those inline
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(data, pos, end)
        wire_type = key & 7
        if wire_type == 2 or wire_type == 0:
            if pos >= end:
                raise _Unusual
            value = data[pos]
            if value < 0x80:
                pos += 1
            else:
                value, pos = _varint(data, pos, end)
            if wire_type == 2:
                if pos + value > end:
                    raise _Unusual
                append((key >> 3, 2, (pos, pos + value)))
                pos += value
            else:
                append((key >> 3, 0, value))
        elif wire_type == 1:
            if pos + 8 > end:
                raise _Unusual
            append((key >> 3, 1, pos))
            pos += 8
        else:  # fixed32 and groups never occur in a plain tensor event
            raise _Unusual
    if pos != end:
        raise _Unusual
    return fields


def _once(seen: set[int], field: int) -> None:
    # A repeated singular message field would be merged by protobuf; leave that to it.
    if field in seen:
        raise _Unusual
    seen.add(field)


def _text(data: memoryview, span: tuple[int, int]) -> str:
    try:
        return bytes(data[span[0] : span[1]]).decode("utf-8")  # proto3 strings must be UTF-8
    except UnicodeDecodeError:
        raise _Unusual from None


PlainEvent = tuple[str, int, float, ModeKeys, int, int, tuple[int, ...], memoryview]


def parse_plain_event(payload: bytes | memoryview) -> PlainEvent:
    """(tag, step, wall_time, mode, mode_step, dtype number, shape, tensor_content) of a plain
    tensor event. Raises ``_Unusual`` for anything else."""
    data = memoryview(payload)
    if data.ndim != 1 or data.itemsize != 1:
        data = data.cast("B")
    step = 0
    wall_time = 0.0
    summary: tuple[int, int] | None = None
    seen: set[int] = set()
    for field, wire_type, value in _fields(data, 0, len(data)):
        if field == 1 and wire_type == 1:
            (wall_time,) = _DOUBLE.unpack_from(data, value)
        elif field == 2 and wire_type == 0:
            if value >= _INT64_SPAN:
                raise _Unusual
            step = value - _INT64_SPAN if value > _INT64_MAX else value
        elif field == 5 and wire_type == 2:
            _once(seen, 5)
            summary = value
        else:
            raise _Unusual
    if summary is None:
        raise _Unusual
    first_value: tuple[int, int] | None = None
    for field, wire_type, value in _fields(data, *summary):
        if field != 1 or wire_type != 2 or first_value is not None:
            raise _Unusual  # several values: rare enough to leave to protobuf
        first_value = value
    if first_value is None:
        raise _Unusual
    tag = ""
    metadata: tuple[int, int] | None = None
    tensor: tuple[int, int] | None = None
    seen = set()
    for field, wire_type, value in _fields(data, *first_value):
        if wire_type != 2:
            raise _Unusual
        if field == 1:
            tag = _text(data, value)
        elif field == 9:
            _once(seen, 9)
            metadata = value
        elif field == 8:
            _once(seen, 8)
            tensor = value
        else:
            raise _Unusual
    if tensor is None:
        raise _Unusual
    mode, mode_step = ModeKeys.GLOBAL, step
    if metadata is not None:
        mode, saved_mode_step = _cached(_METADATA, data, metadata, _metadata)
        if saved_mode_step is not None:
            mode_step = saved_mode_step
    dtype_number = 0
    shape: tuple[int, ...] = ()
    content_span = (0, 0)
    seen = set()
    for field, wire_type, value in _fields(data, *tensor):
        if field == 1 and wire_type == 0:
            dtype_number = value
        elif field == 2 and wire_type == 2:
            _once(seen, 2)
            shape = _cached(_SHAPES, data, value, _shape)
        elif field == 3 and wire_type == 0:
            pass  # version_number: unused
        elif field == 4 and wire_type == 2:
            content_span = value
        else:
            raise _Unusual  # typed repeated values, strings: protobuf's job
    return tag, step, wall_time, mode, mode_step, dtype_number, shape, data[content_span[0] : content_span[1]]


# Every record of a step carries the same metadata bytes, and a tensor keeps its shape from step
# to step: parsed once, looked up by their bytes afterwards (bounded: cleared when full).
_METADATA: dict[bytes, tuple[ModeKeys, int | None]] = {}
_SHAPES: dict[bytes, tuple[int, ...]] = {}
_MAX_CACHED = 4096


def _cached(cache: dict[bytes, Any], data: memoryview, span: tuple[int, int], parse: Any) -> Any:
    key = bytes(data[span[0] : span[1]])
    found = cache.get(key)
    if found is None:
        found = parse(data, span)  # _Unusual propagates: nothing is cached for odd bytes
        if len(cache) >= _MAX_CACHED:
            cache.clear()
        cache[key] = found
    return found


def _metadata(data: memoryview, span: tuple[int, int]) -> tuple[ModeKeys, int | None]:
    """(mode, mode step or None) from a Value's SummaryMetadata plugin data."""
    mode, mode_step = ModeKeys.GLOBAL, None
    for field, wire_type, value in _fields(data, *span):
        if field != 1 or wire_type != 2:
            raise _Unusual
        name, content = "", b""
        for inner, inner_type, inner_span in _fields(data, *value):
            if inner_type != 2 or inner not in (1, 2):
                raise _Unusual
            if inner == 1:
                name = _text(data, inner_span)
            else:
                content = bytes(data[inner_span[0] : inner_span[1]])
        text = content.decode("utf-8", "replace")
        try:  # the same conversions as decode_event, so a bad value fails the same way there
            if name == "mode":
                mode = ModeKeys(int(text))
            elif name == "mode_step":
                mode_step = int(text)
        except ValueError:
            raise _Unusual from None
    return mode, mode_step


def _shape(data: memoryview, span: tuple[int, int]) -> tuple[int, ...]:
    sizes = []
    for field, wire_type, value in _fields(data, *span):
        if field != 2 or wire_type != 2:
            raise _Unusual  # unknown_rank, or odd bytes
        size = 0
        for inner, inner_type, inner_value in _fields(data, *value):
            if inner != 1 or inner_type != 0 or inner_value > _INT64_MAX:
                raise _Unusual  # named or negative dims
            size = inner_value
        sizes.append(size)
    return tuple(sizes)


def decode_tensor_event(payload: bytes | memoryview, path: str = "<memory>", offset: int = 0) -> DecodedTensor:
    """What :func:`decode_event` returns, without copying the tensor's bytes where it can.

    The array is a read-only view of ``payload``'s buffer (keeping that buffer alive) for
    numeric tensors stored in ``tensor_content``; bfloat16 widens to float32 as there.
    """
    try:
        tag, step, wall_time, mode, mode_step, dtype_number, shape, content = parse_plain_event(payload)
    except _Unusual:
        return decode_event(payload, path, offset)
    if dtype_number == DT_BFLOAT16 and len(content):
        array = _mark_bfloat16(_bfloat16_to_float32(np.frombuffer(content, dtype="<u2")).reshape(shape))
    elif dtype_number in _READ_DTYPES and (len(content) or 0 in shape):
        dtype = _READ_DTYPES[dtype_number]
        try:
            array = np.frombuffer(content, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(shape)
        except ValueError:  # content and shape disagree: decode_event raises its own error
            return decode_event(payload, path, offset)
        if array.flags.writeable:  # a writable buffer (bytearray): never let callers write into it
            array.flags.writeable = False
    else:
        return decode_event(payload, path, offset)
    return DecodedTensor(tag=tag, value=array, step=step, mode=mode, mode_step=mode_step, wall_time=wall_time)
