"""The loss tensors a step has saved, known by identity, so that a model passing its loss on as
its own output (``forward`` returns the loss its loss module or ``F.cross_entropy`` computed, as
Hugging Face models do) saves it once, as the loss, and not again as ``<Model>_output_0``."""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["StepLosses"]


class StepLosses:
    """Loss tensors of the current saved step. Identity, not ``id()`` alone: a freed loss's id
    may be reused by a later tensor of the same step, which must still be saved."""

    def __init__(self) -> None:
        self._tensors: dict[int, weakref.ref[Any]] = {}

    def add(self, tensor: Any) -> None:
        try:
            self._tensors[id(tensor)] = weakref.ref(tensor)
        except TypeError:  # not weak-referenceable: not a tensor we would skip
            pass

    def __contains__(self, tensor: object) -> bool:
        ref = self._tensors.get(id(tensor))
        return ref is not None and ref() is tensor

    def clear(self) -> None:
        self._tensors.clear()
