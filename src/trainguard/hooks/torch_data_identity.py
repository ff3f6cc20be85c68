"""Which inputs of a root module's call are data: what the data loader feeds, not what the model made.

The data rules (NotNormalizedData, CheckInputImages, ClassImbalance's per-sample count) read the
root call's inputs as "the data". Not every root input is: a word-level language model is given
back its own recurrent state (``output, hidden = model(tokens, repackage_hidden(hidden))``), a
discriminator the generator's samples, a head the encoder's output; a layer whose ``forward()``
the script calls itself makes its first child module look like a root, fed a pre-activation.
Judged as data, their scale (a hidden state's std of 0.05) reads as unnormalised inputs.

A root input is **data** unless one of these holds, checked at every saved call of the root:

* it has autograd history (``grad_fn`` set): it was computed from tensors that require grad
  (parameters), so the model made it. A leaf that requires grad (a physics-informed net's
  collocation points, an adversarial example's input) has no history and stays data;
* it shares its storage with an output of a root call that is still alive: an output fed back
  (``h.detach()`` keeps ``h``'s storage), or one model's output fed to another in the same step
  (``D(G(z).detach())``). The outputs of each saved call are kept as weak references to their
  storages (identity, never addresses: a freed output's memory reused by the next batch is
  another storage) and compared with the same step's later root calls and with the next root call
  after it, the first unsaved one (whose inputs a fed-back state comes from). An output that is
  one of the call's own inputs (a model returning its input) is no product of the model and is
  not kept: a batch sliced from a dataset tensor would otherwise match the next slice.

A name once found not to be data stays so (``<Root>_input_<i>`` is one input slot of the root's
forward): it leaves the ``model_inputs`` collection and joins ``derived_inputs``, which the data
rules skip (rules/builtin/_data_inputs.py). So a discriminator fed both real images and generated
ones under one name is not judged as data at all: the two cannot be told apart by name. Keyword
arguments of the root call are not seen (PyTorch's pre-hooks get positional ones only), as for
every root input. History from an input leaf counts as history too: an adversarial example
built from a batch that requires grad without ``detach()``, or a physics-informed net's points
concatenated from leaves that require grad, is not judged as data (silence, not a false finding).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["DERIVED_INPUTS", "DataIdentity"]

logger = logging.getLogger("trainguard")

# The collection of root inputs found not to be data (see the module docstring).
DERIVED_INPUTS = "derived_inputs"
MODEL_INPUTS = "model_inputs"


def _storage(tensor: torch.Tensor) -> torch.UntypedStorage | None:
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse, meta or wrapper tensors have none to share
        return None


class DataIdentity:
    """Decides, per root input name, whether it is data; held by TorchHook, which calls
    :meth:`saved_root_call` at each saved call of a root and :meth:`next_root_call` with the
    positional arguments of the root calls that take the general path."""

    def __init__(self, collections: Any, add_membership: Callable[[str, str], None]) -> None:
        self._collections = collections  # the hook's CollectionManager
        self._add_membership = add_membership  # the hook's: also invalidates its plan caches
        self._roots: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._data: set[str] = set()  # input names filed as model inputs
        self._derived: set[str] = set()  # input names found not to be data (for good)
        # Storages of the outputs of the root calls of the latest saved step, and that step
        self._outputs: list[weakref.ref[torch.UntypedStorage]] = []
        self._step: int | None = None

    def add_root(self, module: torch.nn.Module) -> None:
        self._roots.add(module)

    def is_root(self, module: torch.nn.Module) -> bool:
        return module in self._roots

    def derived(self) -> frozenset[str]:
        return frozenset(self._derived)

    @property
    def watching(self) -> bool:
        """Whether the next root call is to be checked (outputs of a saved step are kept)."""
        return bool(self._outputs)

    def saved_root_call(
        self, name: str, step: int, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]
    ) -> None:
        """A saved call of the root named ``name``: file each input as data or not, keep its outputs."""
        if step != self._step:
            self._step = step
            self._outputs.clear()  # outputs of an earlier step: only the call right after it looks
        for index, tensor in enumerate(inputs):
            tensor_name = f"{name}_input_{index}"
            if tensor_name in self._derived:
                continue
            if tensor.grad_fn is not None or self._made_by_model(tensor):
                self._mark_derived(tensor_name)
            elif tensor_name not in self._data:
                self._data.add(tensor_name)
                self._add_membership(tensor_name, MODEL_INPUTS)
        own = {id(storage) for tensor in inputs if (storage := _storage(tensor)) is not None}
        for tensor in outputs:
            storage = _storage(tensor)
            if storage is not None and id(storage) not in own:
                self._outputs.append(weakref.ref(storage))

    def next_root_call(self, name: str, inputs: Sequence[torch.Tensor]) -> None:
        """The root call after a saved step (general path; its positional inputs, flattened as the
        forward hooks see them): inputs that are outputs of the saved step's root calls are fed
        back, not data. The outputs are forgotten then: later calls' inputs come from unsaved
        calls, which are not tracked."""
        if not self._outputs:
            return
        try:
            for index, tensor in enumerate(inputs):
                tensor_name = f"{name}_input_{index}"
                if tensor_name not in self._derived and self._made_by_model(tensor):
                    self._mark_derived(tensor_name)
        except Exception:  # noqa: BLE001 - called in the root's pre-forward: nothing may reach training
            logger.debug("trainguard: could not tell whether a root input is fed back", exc_info=True)
        self._outputs.clear()

    def _made_by_model(self, tensor: torch.Tensor) -> bool:
        if not self._outputs:
            return False
        storage = _storage(tensor)
        return storage is not None and any(reference() is storage for reference in self._outputs)

    def _mark_derived(self, tensor_name: str) -> None:
        self._derived.add(tensor_name)
        if tensor_name in self._data:
            self._data.discard(tensor_name)
            self._collections.get(MODEL_INPUTS).tensor_names.discard(tensor_name)
        # (also what makes the hook rewrite its collections file and forget its plans for the name)
        self._add_membership(tensor_name, DERIVED_INPUTS)
