"""Getting tensors out of PyTorch cheaply: host snapshots and on-device reductions.

Only this module and the hook adapters import torch. Reductions run where the tensor lives (GPU
or CPU) and come back as one small tensor; raw values are copied to pinned host memory with a
non-blocking copy on CUDA, and the writer thread waits for the copy, so a save does not stall
the training stream.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np
import torch

from trainguard.format.tensor_codec import DT_BFLOAT16

__all__ = ["HostSnapshot", "reduce_on_device", "snapshot"]

_ON_WRITER_THREAD = threading.local()
_ON_WRITER_THREAD.active = False

HostSnapshot = tuple[np.ndarray | Callable[[], np.ndarray], int, int | None]  # source, nbytes, dtype


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    if tensor.is_sparse:
        tensor = tensor.to_dense()
    if tensor.is_quantized:
        tensor = tensor.dequantize()
    return tensor


def snapshot(tensor: torch.Tensor) -> HostSnapshot:
    """A host copy the training loop may keep mutating the original of."""
    tensor = _plain(tensor)
    proto_dtype = None
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)  # numpy has no bfloat16: ship the bits, tag the type
        proto_dtype = DT_BFLOAT16
    elif tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        tensor = tensor.float()
    nbytes = tensor.numel() * tensor.element_size()
    if tensor.device.type == "cpu":
        copy = tensor.clone(memory_format=torch.contiguous_format)
        array = copy.numpy()
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


def reduce_on_device(tensor: torch.Tensor, requested: Sequence[tuple[str, bool]]) -> HostSnapshot | None:
    """All requested reductions of ``tensor`` as one float64 vector, computed on its device.

    Norms are elementwise (``l2`` = sqrt of the sum of squares of all elements, whatever the
    rank); ``std``/``variance`` are population statistics (ddof=0), as numpy's defaults.
    """
    x = _plain(tensor)
    if x.numel() == 0:
        return None
    if x.device.type == "cpu" and not _ON_WRITER_THREAD.active:
        # On the CPU "where the tensor lives" is here: one copy now; the writer thread runs the
        # same torch kernels on the copy, off the training thread (they release the GIL).
        copy = x.clone()

        def reduce_later() -> np.ndarray:
            _ON_WRITER_THREAD.active = True
            try:
                reduced = reduce_on_device(copy, requested)
            finally:
                _ON_WRITER_THREAD.active = False
            assert reduced is not None and not callable(reduced[0])
            return reduced[0]

        return reduce_later, 8 * len(requested), None
    if x.is_complex():
        x = x.abs()
    if not x.is_floating_point():
        x = x.to(torch.float64)
    elif x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    absolute = None
    values: list[torch.Tensor] = []
    fused: dict[tuple[str, bool], torch.Tensor] = {}
    wanted = set(requested)
    for name, use_abs in requested:
        if (name, use_abs) in fused:
            values.append(fused[(name, use_abs)])
            continue
        if use_abs:
            if absolute is None:
                absolute = x.abs()
            y = absolute
        else:
            y = x
        # Fused kernels: one pass gives two statistics (fewer ops is what costs on the CPU).
        if name in ("min", "max") and {("min", use_abs), ("max", use_abs)} <= wanted:
            fused[("min", use_abs)], fused[("max", use_abs)] = torch.aminmax(y)
            values.append(fused[(name, use_abs)])
            continue
        if name in ("mean", "std") and {("mean", use_abs), ("std", use_abs)} <= wanted:
            fused[("std", use_abs)], fused[("mean", use_abs)] = torch.std_mean(y, correction=0)
            values.append(fused[(name, use_abs)])
            continue
        if name == "min":
            values.append(y.min())
        elif name == "max":
            values.append(y.max())
        elif name == "mean":
            values.append(y.mean())
        elif name == "std":
            values.append(y.std(correction=0))
        elif name == "variance":
            values.append(y.var(correction=0))
        elif name == "sum":
            values.append(y.sum())
        elif name == "prod":
            values.append(y.prod())
        elif name == "l1":
            values.append(torch.linalg.vector_norm(y, 1))
        elif name == "l2":
            values.append(torch.linalg.vector_norm(y, 2))
        elif name == "zero_fraction":
            values.append((y == 0).sum() / y.numel())
        else:  # validated at configuration time; reaching here is a bug
            raise ValueError(f"unknown reduction {name!r}")
    stacked = torch.stack(values).to(torch.float64)
    if stacked.device.type == "cpu":
        return stacked.numpy(), 8 * len(values), None  # a fresh tensor: no copy needed
    return snapshot(stacked)
