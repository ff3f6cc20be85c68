"""Which of a model's parameters are weights, whatever they are called.

smdebug's collections find a model's parameters by name: ``weights`` is ``.*weight`` and
``biases`` ``.*bias`` on ``<RootClass>_<parameter path>``. That suits ``nn.Linear`` and the other
built-in layers, but a parameter a script declares itself (a graph convolution's
``self.kernel = nn.Parameter(...)``, a ``ParameterList`` of filters, a bare tensor on the root
module) matches neither, and then no rule that reads weights (WeightUpdateRatio, UnchangedTensor,
AllZero, TensorVariance) sees the model at all: its learning-rate faults go unwatched.

So every trainable parameter of a registered model that neither collection names becomes a member
of ``weights`` by name (``Collection.tensor_names``, which the collections file carries: smdebug
readers and the rules see the same membership). Names are the hook's usual ones, kept for every
parameter: ``<RootClass>_<path from named_parameters()>``, e.g. ``GCN_layer1.kernel``, a bare
parameter on the root ``GCN_kernel``, a ``ParameterList`` entry ``Net_filters.0``, a
``ParameterDict`` entry ``Net_table.key``; their gradients are ``gradient/<that name>`` in
``gradients`` as before. Biases stay what ``biases`` names: a 1-d parameter called anything else
(``offset``, ``shift``) is a weight here, since nothing but a name says what it is for; rules that
compare updates with a weight's norm therefore must not assume a weight starts far from zero.

The set is resolved once per registered model, when it is registered, not per step. A parameter
added to a model after that (a module attached later) keeps smdebug's name-based membership only,
and so does every parameter when ``weights`` was defined without smdebug's regex (a collection the
user made anew says itself what it holds; configured regexes added to smdebug's keep this).
Parameters that only an optimizer holds (a bare tensor not in any registered model) are not
captured.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trainguard.config.collections import DEFAULT_PYTORCH_COLLECTIONS, CollectionManager

__all__ = ["ParameterRoles", "parameter_tensor_name"]


def parameter_tensor_name(root_name: str, parameter_name: str) -> str:
    """The tensor name of a parameter of the registered model ``root_name`` (smdebug's)."""
    return f"{root_name}_{parameter_name}"


class ParameterRoles:
    """Puts a registered model's unnamed trainable parameters into ``weights``.

    ``add_membership(tensor_name, collection_name)`` is the hook's: it records the membership
    and makes the hook forget what it decided per tensor name."""

    __slots__ = ("_collections", "_add_membership")

    def __init__(self, collections: CollectionManager, add_membership: Callable[[str, str], None]) -> None:
        self._collections = collections
        self._add_membership = add_membership

    def add_model(self, root_name: str, module: torch.nn.Module) -> list[str]:
        """Make every trainable parameter of ``module`` that no name-based collection holds a
        member of ``weights``; returns the tensor names added."""
        if "weights" not in self._collections:
            return []
        weights = self._collections.get("weights")
        if not set(DEFAULT_PYTORCH_COLLECTIONS["weights"]) <= set(weights.include_regex):
            return []  # a weights collection defined anew (not smdebug's, extended): it says what it holds
        biases = self._collections.get("biases") if "biases" in self._collections else None
        added: list[str] = []
        for parameter_name, parameter in module.named_parameters():
            if not parameter.requires_grad:
                continue  # not trainable: nothing for the update rules to judge
            name = parameter_tensor_name(root_name, parameter_name)
            if weights.matches(name) or (biases is not None and biases.matches(name)):
                continue
            self._add_membership(name, "weights")
            added.append(name)
        return added
