"""Getting tensors out of PyTorch cheaply: host snapshots and on-device reductions.

Only this module and the hook adapters import torch. Reductions run where the tensor lives (GPU
or CPU) and come back as one small tensor; raw values are copied to pinned host memory with a
non-blocking copy on CUDA, and the writer thread waits for the copy, so a save does not stall
the training stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from trainguard.format.tensor_codec import DT_BFLOAT16
from trainguard.hooks.torch_reductions import as_float, compute_reductions, compute_reductions_many

__all__ = [
    "DeferredReductions",
    "HostSnapshot",
    "compute_reductions",
    "compute_reductions_many",
    "flatten_tensors",
    "reduce_on_device",
    "snapshot",
]

HostSnapshot = tuple[np.ndarray | Callable[[], np.ndarray], int, int | None]  # source, nbytes, dtype
# dtypes numpy holds as they are (no bfloat16/float8 bits to re-tag, no quantized values)
_NUMPY_NATIVE = frozenset((torch.float32, torch.float64, torch.float16, torch.bool))
_NUMPY_NATIVE |= {torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8}


def flatten_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in a module's inputs or output (nested lists, tuples and dicts), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in flatten_tensors(item)]
    if isinstance(value, dict):
        return [tensor for item in value.values() for tensor in flatten_tensors(item)]
    return []


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    if tensor.is_sparse:
        tensor = tensor.to_dense()
    if tensor.is_quantized:
        tensor = tensor.dequantize()
    return tensor


def snapshot(tensor: torch.Tensor, *, copy: bool = True) -> HostSnapshot:
    """A host copy the training loop may keep mutating the original of.

    ``copy=False``, for a writer that copies what it is handed at once (the writer process copies
    into shared memory): a CPU tensor comes back as a view of its own memory, not cloned twice."""
    if tensor.is_cpu and tensor.dtype in _NUMPY_NATIVE and tensor.layout is torch.strided:
        # The usual case (dense CPU tensors of a type numpy has), with no checks beyond these:
        # a saved step takes a dozen or more snapshots, each on the training thread.
        host = tensor.detach()
        host = host.clone(memory_format=torch.contiguous_format) if copy else host.contiguous()
        return host.numpy(), host.nbytes, None
    tensor = _plain(tensor)
    proto_dtype = None
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)  # numpy has no bfloat16: ship the bits, tag the type
        proto_dtype = DT_BFLOAT16
    elif tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        tensor = tensor.float()
    nbytes = tensor.numel() * tensor.element_size()
    if tensor.device.type == "cpu":
        host = tensor.clone(memory_format=torch.contiguous_format) if copy else tensor.contiguous()
        array = host.numpy()
        return (array.view(np.uint16) if proto_dtype else array), nbytes, proto_dtype
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=tensor.device.type == "cuda")
    host.copy_(tensor, non_blocking=True)
    done = torch.cuda.Event() if tensor.device.type == "cuda" else None
    if done is not None:
        done.record()

    def resolve() -> np.ndarray:
        if done is not None:
            done.synchronize()
        array = host.numpy()
        return array.view(np.uint16) if proto_dtype else array

    return resolve, nbytes, proto_dtype


def reduce_on_device(
    tensor: torch.Tensor, requested: Sequence[tuple[str, bool]], *, copy: bool = True
) -> HostSnapshot | None:
    """All requested reductions of ``tensor`` as one float64 vector, computed on its device.

    Norms are elementwise (``l2`` = sqrt of the sum of squares of all elements, whatever the
    rank); ``std``/``variance`` are population statistics (ddof=0), as numpy's defaults.
    On CUDA the kernels queue on the training stream, which orders them before any later
    in-place update. On the CPU "where the tensor lives" is here: one copy now, and the writer
    thread runs the same kernels on the copy, off the training thread.
    """
    x = _plain(tensor)
    if x.numel() == 0:
        return None
    if x.device.type == "cpu":
        # copy=False: the writer copies (or reduces) at hand-over, right after (see snapshot)
        return DeferredReductions(x.clone() if copy else x, tuple(requested)), 8 * len(requested), None
    return snapshot(compute_reductions(x, requested))


class DeferredReductions:
    """A CPU tensor's copy whose reductions the writer thread computes.

    The writer hands all such items of a step to :meth:`resolve_many` at once: multi-tensor
    kernels then serve every tensor with the same requests (one dispatch for all the norms
    instead of one per tensor), which is most of the cost for the small tensors of a model.
    """

    __slots__ = ("tensor", "requested")

    def __init__(self, tensor: torch.Tensor, requested: tuple[tuple[str, bool], ...]) -> None:
        self.tensor = tensor
        self.requested = requested

    def __call__(self) -> np.ndarray:
        return compute_reductions(self.tensor, self.requested).numpy()

    def host_array(self) -> np.ndarray:
        """The copy as a numpy array numpy can reduce (a writer process reduces it there)."""
        tensor = self.tensor
        if tensor.dtype == torch.bfloat16 or tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            tensor = tensor.float()  # numpy has no such type; widening is exact
        return tensor.numpy()

    @staticmethod
    def resolve_many(items: Sequence[DeferredReductions]) -> list[np.ndarray]:
        """The reductions of every item, in order."""
        groups: dict[tuple[object, ...], list[tuple[int, torch.Tensor]]] = {}
        for index, item in enumerate(items):
            x = as_float(item.tensor)
            groups.setdefault((item.requested, x.dtype), []).append((index, x))
        results: list[np.ndarray] = [np.empty(0)] * len(items)
        for (requested, _), members in groups.items():
            table = compute_reductions_many([x for _, x in members], requested).numpy()  # type: ignore[arg-type]
            for (index, _), row in zip(members, table, strict=True):
                results[index] = row
        return results
