"""The on-disk format, compatible both ways with smdebug 1.0.34. Pure encoding; no I/O."""

from trainguard.format.index import IndexEntry, StepIndex, parse_index, render_index
from trainguard.format.record import frame, iter_records, parse_record
from trainguard.format.tensor_codec import DecodedTensor, EncodedTensor, decode_event, encode_tensor_event

__all__ = [
    "DecodedTensor",
    "EncodedTensor",
    "IndexEntry",
    "StepIndex",
    "decode_event",
    "encode_tensor_event",
    "frame",
    "iter_records",
    "parse_index",
    "parse_record",
    "render_index",
]
