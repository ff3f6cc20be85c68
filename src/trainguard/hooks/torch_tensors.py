"""Getting tensors out of PyTorch cheaply: host snapshots and on-device reductions.

Only this module and the hook adapters import torch. Reductions run where the tensor lives (GPU
or CPU) and come back as one small tensor; raw values are copied to pinned host memory with a
non-blocking copy on CUDA, and the writer thread waits for the copy, so a save does not stall
the training stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from trainguard.format.tensor_codec import DT_BFLOAT16

__all__ = [
    "DeferredReductions",
    "HostSnapshot",
    "compute_reductions",
    "compute_reductions_many",
    "reduce_on_device",
    "snapshot",
]

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
    On CUDA the kernels queue on the training stream, which orders them before any later
    in-place update. On the CPU "where the tensor lives" is here: one copy now, and the writer
    thread runs the same kernels on the copy, off the training thread.
    """
    x = _plain(tensor)
    if x.numel() == 0:
        return None
    if x.device.type == "cpu":
        return DeferredReductions(x.clone(), tuple(requested)), 8 * len(requested), None
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

    @staticmethod
    def resolve_many(items: Sequence[DeferredReductions]) -> list[np.ndarray]:
        """The reductions of every item, in order."""
        groups: dict[tuple[object, ...], list[tuple[int, torch.Tensor]]] = {}
        for index, item in enumerate(items):
            x = _as_float(item.tensor)
            groups.setdefault((item.requested, x.dtype), []).append((index, x))
        results: list[np.ndarray] = [np.empty(0)] * len(items)
        for (requested, _), members in groups.items():
            table = compute_reductions_many([x for _, x in members], requested).numpy()  # type: ignore[arg-type]
            for (index, _), row in zip(members, table, strict=True):
                results[index] = row
        return results


def _as_float(x: torch.Tensor) -> torch.Tensor:
    if x.is_complex():
        return x.abs()
    if not x.is_floating_point():
        return x.to(torch.float64)
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.float()
    return x


def compute_reductions(x: torch.Tensor, requested: Sequence[tuple[str, bool]]) -> torch.Tensor:
    """The requested reductions of ``x`` stacked into one float64 tensor on ``x``'s device."""
    return compute_reductions_many([_as_float(x)], tuple(requested))[0]


# Computed by one multi-tensor kernel for all tensors; the others take one kernel per tensor.
_FOREACH_NORMS = {"l1": 1, "l2": 2}


def compute_reductions_many(tensors: list[torch.Tensor], requested: tuple[tuple[str, bool], ...]) -> torch.Tensor:
    """Reductions of float tensors of one dtype and device: row ``i`` holds ``tensors[i]``'s.

    ``std``/``variance`` take two passes (the mean, then the norm of the deviations): torch's
    std_mean/var_mean take ten times longer on the CPU, and E[x^2] - E[x]^2 loses all
    precision when |mean| >> std. Population statistics (ddof=0), as numpy's defaults.
    """
    columns: dict[tuple[str, bool], list[torch.Tensor]] = {}
    bases: dict[bool, list[torch.Tensor]] = {False: tensors}
    for name, use_abs in requested:
        key = (name, use_abs)
        if key in columns:
            continue
        ys = bases.get(use_abs)
        if ys is None:
            ys = bases[use_abs] = torch._foreach_abs(tensors)
        if name in ("min", "max"):
            pairs = [torch.aminmax(y) for y in ys]  # one pass gives both
            columns[("min", use_abs)] = [pair[0] for pair in pairs]
            columns[("max", use_abs)] = [pair[1] for pair in pairs]
        elif name in ("mean", "std", "variance"):
            means = columns.get(("mean", use_abs))
            if means is None:
                means = columns[("mean", use_abs)] = [y.mean() for y in ys]
            if name != "mean":  # the deviations' norm; scaled by 1/sqrt(n) below
                columns[("std", use_abs)] = list(torch._foreach_norm(torch._foreach_sub(ys, means)))
        elif name in _FOREACH_NORMS:
            columns[key] = list(torch._foreach_norm(ys, _FOREACH_NORMS[name]))
        elif name == "sum":
            columns[key] = [y.sum() for y in ys]
        elif name == "prod":
            columns[key] = [y.prod() for y in ys]
        elif name == "zero_fraction":
            # 1 - nonzero/n: count_nonzero is twice as fast as (y == 0).sum()
            columns[key] = [1.0 - torch.count_nonzero(y).to(y.dtype) / y.numel() for y in ys]
        else:  # validated at configuration time; reaching here is a bug
            raise ValueError(f"unknown reduction {name!r}")
    sources = list(dict.fromkeys(("std", key[1]) if key[0] == "variance" else key for key in requested))
    table = torch.stack([value for key in sources for value in columns[key]]).to(torch.float64)
    table = table.reshape(len(sources), len(tensors))
    rows = dict(zip(sources, table, strict=True))
    if any(key[0] == "std" for key in sources):
        scale = torch.tensor([tensor.numel() for tensor in tensors], dtype=torch.float64, device=table.device).rsqrt()
        for key in sources:
            if key[0] == "std":
                rows[key] = rows[key] * scale
    picked = [rows[("std", key[1])].square() if key[0] == "variance" else rows[key] for key in requested]
    return torch.stack(picked, dim=1)
