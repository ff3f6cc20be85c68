"""A small fingerprint of every parameter per rank, so that replicas that drift apart are seen.

Data-parallel replicas must hold the same parameters after every optimizer step; when one does
not (an update outside the all-reduce, a parameter outside the DDP module, a rank seeded apart
and never broadcast), every metric still looks normal. On the steps the ``replica_fingerprints``
collection is due (the hook's schedule, or the collection's own ``save_interval`` for a cheap
check every N steps), each rank writes two tensors (smdebug's format, in that collection):

* ``replica_fingerprint/parameters``: one row per parameter of the registered models, after the
  step's optimizer update (the step ends at the next forward, the update is done by then);
* ``replica_fingerprint/gradients``: the same rows for the gradients the first optimizer step of
  the step applies (after DDP's all-reduce), taken by an optimizer pre-hook that exists only on
  those steps. A parameter without a gradient gets ``-1`` as its hash.

Each row is ``[hash, sum of squares, elements]`` (float64, every value finite: a tensor missing
(a parameter without a gradient) is ``[-1, 0, 0]``); files written before hold four columns,
``[hash, sum, sum of squares, elements]``, which the rule reads too. The hash is what decides
equality: the wrapping 64-bit integer sum of the tensor's raw bits (viewed as int64, or int32
where its size is not a multiple of 8 bytes), multiplied by an odd constant and cut to its top 52
bits so that a float64 holds it exactly. Integer addition modulo 2^64 does not depend on the
order of the reduction, so equal bits give equal hashes bit for bit on any kernel, thread count
or device; a change of any element changes the sum unless other changes cancel it exactly
(unrelated changes: about 2^-52). Moving values between positions of the same parity goes
unseen, which no replica fault does. Each tensor is reduced on its device, two passes at about
memory speed (its bits' sum, and its norm, one call for all tensors; a CRC-32 of the bytes cost
20 times more on CPU, and a float sum besides the norm was a third of the cost for a figure the
norm gives as well: bench/ddp_fingerprint.py), and a due step's figures, the gradients' with the parameters',
come back to the host in one copy per kind at the step's end (``PendingRows``, ``read_rows``):
on an accelerator one wait for the device per due step, none inside the optimizer step. The sum
of squares (float32 accumulation) is not exact across reduction orders: it only says how far apart
two replicas are, and lets a rule compare within a tolerance where the reduction itself is not
deterministic.

The row order is the names in the collections file's ``_meta`` (``replica_fingerprints``:
``parameters``, ``sharded``, ``rank``, ``world``); names only grow (a model registered later
appends its parameters), so a row ``i`` of an older step is still name ``i``. Parameters meant to
differ between ranks (FSDP's flat or DTensor shards, DeepSpeed ZeRO partitions) are listed under
``sharded``; a rule must not compare those. Buffers are not fingerprinted: DDP broadcasts them
before a forward and each rank's own batch updates them after it (BatchNorm's running
statistics), so they legitimately differ at the step's end.

Single-process runs write nothing (there is nothing to compare with) unless ``always`` is set
(the benchmark's). Fail open: any error disables the fingerprint, never the capture or training.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

__all__ = [
    "COLLECTION",
    "GRADIENTS_TENSOR",
    "META_KEY",
    "PARAMETERS_TENSOR",
    "PendingRows",
    "ReplicaFingerprints",
    "bit_words",
    "fingerprint_rows",
    "read_rows",
]

logger = logging.getLogger("trainguard")

COLLECTION = "replica_fingerprints"
PARAMETERS_TENSOR = "replica_fingerprint/parameters"
GRADIENTS_TENSOR = "replica_fingerprint/gradients"
META_KEY = "replica_fingerprints"
NO_GRADIENT = -1.0

_MIX = 0x9E3779B97F4A7C15  # odd: multiplying by it is a bijection modulo 2^64


def _is_sharded(parameter: torch.Tensor) -> bool:
    """A parameter that holds a different part of the model on each rank by design."""
    kind = type(parameter).__name__
    if kind in ("DTensor", "FlatParameter") or getattr(parameter, "_is_flat_param", False):
        return True
    return hasattr(parameter, "ds_id") or hasattr(parameter, "ds_numel")  # DeepSpeed ZeRO


def bit_words(tensor: torch.Tensor) -> torch.Tensor | None:
    """``tensor``'s raw bits as a flat integer view in its logical order (8-byte words, or 4- or
    1-byte ones where the size asks), without a copy; None where that needs one (not contiguous)."""
    if tensor.dim() == 0 or not tensor.is_contiguous():
        return None
    size = tensor.shape[-1] * tensor.element_size()
    if size % 8 == 0:
        # rows of whole 8-byte words: the flat copy's words, without the reshape's dispatch
        return tensor.view(torch.int64)
    flat = tensor.reshape(-1)  # contiguous: a view, no copy
    size = flat.numel() * flat.element_size()
    if size % 8 == 0:
        return flat.view(torch.int64)
    return flat.view(torch.int32) if size % 4 == 0 else flat.view(torch.uint8)  # (odd sizes: rare and small)


def _bits_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The wrapping integer sum of ``tensor``'s raw bits in its logical order (the bytes of its
    flat contiguous copy), as a 0-d int64 tensor on its device (an integer sum is int64)."""
    words = bit_words(tensor)
    if words is None:
        words = bit_words(tensor.reshape(-1).clone()) if tensor.dim() else bit_words(tensor.reshape(1))
    assert words is not None
    return words.sum()


def _hash(bits_sum: int) -> float:
    # the top 52 bits of the sum times an odd constant: every bit of the sum moves them, and a
    # float64 holds them exactly
    return float((((bits_sum & 0xFFFFFFFFFFFFFFFF) * _MIX) & 0xFFFFFFFFFFFFFFFF) >> 12)


def _hashes(bits_sums: np.ndarray) -> np.ndarray:
    """:func:`_hash` of each of ``bits_sums`` (uint64), at once: numpy's uint64 product wraps."""
    with np.errstate(over="ignore"):
        return ((bits_sums * np.uint64(_MIX)) >> np.uint64(12)).astype(np.float64)


class PendingRows:
    """A fingerprint's reductions, launched on the tensors' devices and not yet read back, so that
    a step's gradients (taken before its optimizer step) and parameters (at its end) come back
    together in one copy per kind: on an accelerator one wait for the device per due step."""

    __slots__ = ("count", "present", "integer_sums", "norms", "sizes")

    def __init__(self, tensors: list[torch.Tensor | None], words: list[torch.Tensor | None] | None = None) -> None:
        """``words``: :func:`bit_words` of ``tensors`` made earlier (None entries: made here), so
        that tensors which keep their storage (parameters) do not pay for the view each time."""
        self.count = len(tensors)
        self.present: list[int] = []
        self.integer_sums: list[torch.Tensor] = []
        self.sizes: list[int] = []
        values_of: list[torch.Tensor] = []
        # A small model's fingerprint is mostly per-tensor dispatch and Python, not arithmetic:
        # each tensor costs its bits' sum (plus a dtype view), the norms are one call for all of
        # them, and nothing else is done per tensor here.
        integer_sums, sizes, present = self.integer_sums, self.sizes, self.present
        with torch.no_grad():
            for index, tensor in enumerate(tensors):
                if tensor is None:
                    continue
                bits = words[index] if words is not None else None
                integer_sums.append(_bits_sum(tensor) if bits is None else bits.sum())
                values_of.append(tensor if tensor.dtype is torch.float32 else tensor.float())
                sizes.append(tensor.numel())
                present.append(index)
            try:
                self.norms = list(torch._foreach_norm(values_of)) if values_of else []
            except RuntimeError:  # tensors on several devices
                self.norms = [torch.linalg.vector_norm(values) for values in values_of]


def read_rows(*pending: PendingRows) -> list[np.ndarray]:
    """The rows of each pending fingerprint (``[hash, sum of squares, elements]`` per tensor,
    see the module doc; a None tensor gets ``[-1, 0, 0]``), read back together: the bits'
    sums, viewed as float64, travel in the same copy as the norms."""
    integer_sums = [value for part in pending for value in part.integer_sums]
    norms = [value for part in pending for value in part.norms]
    hashes = read = np.empty(0)
    if integer_sums:
        try:
            packed = torch.cat([torch.stack(integer_sums).view(torch.float64), torch.stack(norms).double()])
            numbers = packed.cpu().numpy()
            hashes = _hashes(numbers[: len(integer_sums)].view(np.uint64))
            read = numbers[len(integer_sums) :]
        except RuntimeError:  # tensors on several devices
            hashes = np.array([_hash(int(value)) for value in integer_sums])
            read = np.array([float(value) for value in norms])
    results = []
    at = 0
    for part in pending:
        rows = np.empty((part.count, 3), dtype=np.float64)
        count = len(part.present)
        # every tensor present (the usual case): slices, not index lists, fill the columns
        where: slice | list[int] = slice(None) if count == part.count else part.present
        rows[:] = (NO_GRADIENT, 0.0, 0.0)
        if count:
            norms_read = read[at : at + count]
            rows[where, 0] = hashes[at : at + count]
            rows[where, 1] = norms_read * norms_read
            rows[where, 2] = part.sizes
            at += count
        results.append(rows)
    return results


def fingerprint_rows(tensors: list[torch.Tensor | None]) -> np.ndarray:
    """``[hash, sum of squares, elements]`` per tensor (see the module doc); a None tensor
    gets the row ``[-1, 0, 0]``."""
    return read_rows(PendingRows(tensors))[0]


class ReplicaFingerprints:
    """What TorchHook holds to fingerprint its models' parameters and gradients on due steps.

    The hook calls :meth:`add_model` as it names a registered model, :meth:`step_began` and
    :meth:`step_ended` around each saved step, and :meth:`facts` when it writes its collections
    file. ``hook`` is read for ``saving_this_step``, ``_due``, ``_rank_and_world()``,
    ``write_tensor`` and ``_collections_dirty``; nothing else of it is touched."""

    __slots__ = ("_hook", "_names", "_parameters", "_sharded", "_seen", "_disabled", "_always",
                 "_grad_pending", "_pre_handle", "_world", "_words")  # fmt: skip

    def __init__(self, hook: Any, *, always: bool = False) -> None:
        self._hook = hook
        self._names: list[str] = []
        self._parameters: list[weakref.ref[torch.Tensor]] = []
        self._sharded: list[str] = []
        self._seen: set[int] = set()
        self._disabled = False
        self._always = always
        self._grad_pending: PendingRows | None = None
        self._pre_handle: Any = None
        self._world: tuple[int, int] | None = None
        self._words: list[tuple[torch.Tensor | None, int, int]] = []  # per parameter: bit_words, data_ptr, numel

    # -- what the hook calls ---------------------------------------------------------------------
    def add_model(self, root_name: str, module: torch.nn.Module) -> None:
        self._guarded(self._add_model, root_name, module)

    def step_began(self) -> None:
        if not self._disabled and self._due():
            self._guarded(self._attach)

    def step_ended(self) -> None:
        if self._pre_handle is None and (self._disabled or not self._due()):
            return
        self._guarded(self._write)
        self._detach()

    def facts(self) -> dict[str, object]:
        if self._disabled or not self._names:
            return {}
        rank, world = self._rank_and_world()
        if world == 1 and not self._always:
            return {}  # nothing is fingerprinted: no names to list in every single-process run
        return {META_KEY: {"parameters": list(self._names), "sharded": list(self._sharded), "rank": rank,
                           "world": world}}  # fmt: skip

    def close(self) -> None:
        self._detach()

    # -- inside --------------------------------------------------------------------------------
    def _guarded(self, function: Callable[..., None], *args: Any) -> None:
        try:
            function(*args)
        except Exception:  # noqa: BLE001 - fail open: the fingerprint goes, capture and training stay
            self._disabled = True
            self._detach()
            logger.warning("trainguard: replica fingerprints disabled after an error", exc_info=True)

    def _rank_and_world(self) -> tuple[int, int]:
        if self._world is None or self._world[1] == 1:
            known = self._world
            self._world = self._hook._rank_and_world()  # until a process group exists, asked again
            if known is not None and self._world[1] > 1:
                self._hook._collections_dirty = True  # the names go into the collections file now
        return self._world

    def _due(self) -> bool:
        hook = self._hook
        if not hook.saving_this_step or COLLECTION not in hook._due or not self._names:
            return False
        return self._always or self._rank_and_world()[1] > 1

    def _add_model(self, root_name: str, module: torch.nn.Module) -> None:
        for parameter_name, parameter in module.named_parameters():
            if id(parameter) in self._seen:
                continue
            self._seen.add(id(parameter))
            name = f"{root_name}_{parameter_name}"
            self._names.append(name)
            self._parameters.append(weakref.ref(parameter))
            if _is_sharded(parameter) or "FullyShardedDataParallel" in type(module).__name__:
                self._sharded.append(name)
        self._hook._collections_dirty = True

    def _attach(self) -> None:
        self._grad_pending = None
        if self._pre_handle is None:
            self._pre_handle = register_optimizer_step_pre_hook(self._before_optimizer_step)

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._grad_pending is None and not self._disabled:
            self._guarded(self._take_gradients)

    def _take_gradients(self) -> None:
        gradients = []
        for reference in self._parameters:
            parameter = reference()
            gradients.append(None if parameter is None else parameter.grad)
        self._grad_pending = PendingRows(gradients)

    def _write(self) -> None:
        parameters = [reference() for reference in self._parameters]
        pending = [PendingRows(parameters, self._parameter_words(parameters))]
        if self._grad_pending is not None:
            pending.append(self._grad_pending)
        rows = read_rows(*pending)
        self._hook.write_tensor(PARAMETERS_TENSOR, rows[0], nbytes=rows[0].nbytes)
        if len(rows) > 1:
            self._hook.write_tensor(GRADIENTS_TENSOR, rows[1], nbytes=rows[1].nbytes)

    def _parameter_words(self, parameters: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """The parameters' :func:`bit_words`, made once: an optimizer updates a parameter in
        place, so the view stays its bits; made again where the storage moved (``.data``
        replaced, ``module.to``) or the size changed."""
        words = self._words
        if len(words) < len(parameters):
            words.extend([(None, 0, 0)] * (len(parameters) - len(words)))
        views: list[torch.Tensor | None] = []
        for index, parameter in enumerate(parameters):
            if parameter is None:
                words[index] = (None, 0, 0)  # a parameter gone: its storage is not kept alive here
                views.append(None)
                continue
            view, pointer, size = words[index]
            if view is None or pointer != parameter.data_ptr() or size != parameter.numel():
                view = bit_words(parameter.detach())
                words[index] = (view, parameter.data_ptr(), parameter.numel())
            views.append(view)
        return views

    def _detach(self) -> None:
        handle, self._pre_handle = self._pre_handle, None
        self._grad_pending = None
        if handle is not None:
            handle.remove()
