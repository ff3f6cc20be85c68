"""Reductions (min, max, mean, std, norms...) of many torch tensors at once.

CPU tensors are reduced as numpy views by :mod:`trainguard.hooks.numpy_reductions` (the one
CPU implementation, also used by the writer process; measurements there). On other devices
everything stays there, queued without a host synchronisation: ``aminmax``, multi-tensor norms,
and two passes for the spread (the mean, then the norm of the deviations).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from trainguard.hooks.numpy_reductions import reduce_arrays

__all__ = ["as_float", "compute_reductions", "compute_reductions_many", "host_array"]

Requested = tuple[tuple[str, bool], ...]


def as_float(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a float tensor the kernels accept (complex -> magnitude, ints -> float64)."""
    if x.is_complex():
        return x.abs()
    if not x.is_floating_point():
        return x.to(torch.float64)
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.float()
    return x


def compute_reductions(x: torch.Tensor, requested: Sequence[tuple[str, bool]]) -> torch.Tensor:
    """The requested reductions of ``x`` stacked into one float64 tensor on ``x``'s device."""
    return compute_reductions_many([as_float(x)], tuple(requested))[0]


def compute_reductions_many(tensors: list[torch.Tensor], requested: Requested) -> torch.Tensor:
    """Reductions of float tensors of one dtype and device: row ``i`` holds ``tensors[i]``'s.

    Population statistics (ddof=0), as numpy's defaults; norms are elementwise whatever the
    rank; ``zero_fraction`` is the share of exact zeros.
    """
    if tensors and tensors[0].device.type == "cpu":
        return torch.from_numpy(reduce_arrays([host_array(tensor) for tensor in tensors], requested))
    return _on_device(tensors, requested)


def host_array(tensor: torch.Tensor) -> np.ndarray:
    """A float CPU tensor as a numpy array (a view where it can be: no copy)."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16
        tensor = tensor.float()
    return tensor.resolve_conj().resolve_neg().numpy()


def _on_device(tensors: list[torch.Tensor], requested: Requested) -> torch.Tensor:
    """Accelerator path: every value stays on the device, no host synchronisation."""
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
        elif name in ("l1", "l2"):
            columns[key] = list(torch._foreach_norm(ys, 1 if name == "l1" else 2))
        elif name == "sum":
            columns[key] = [y.sum() for y in ys]
        elif name == "prod":
            columns[key] = [y.prod() for y in ys]
        elif name == "zero_fraction":
            columns[key] = [1.0 - torch.count_nonzero(y).to(y.dtype) / y.numel() for y in ys]
        else:
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
