"""Activations called as functions or tensor methods (``F.relu``, ``torch.tanh``, ``x.sigmoid()``).

Rules such as DeadRelu and SaturatedActivation read the inputs/outputs of activations. Module
activations (``nn.ReLU``...) are captured by the module hooks; most models call them as
functions inside ``forward`` instead, where no module hook can see them. A
:class:`~torch.overrides.TorchFunctionMode` sees every such call, but it costs a Python call per
torch operation, so it is entered only for the forward of a step that saves an activation
collection and left when that forward ends: other steps pay nothing.

Names are deterministic: ``<module>.<kind>_<k>_input`` / ``_output``, where ``<module>`` is the
innermost running module (the hook's smdebug-style name), ``<kind>`` the collection family
(``relu`` for the ReLU family, ``tanh``, ``sigmoid``) and ``k`` counts that module's calls of
the family since the root forward began, in call order.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["ACTIVATION_COLLECTIONS", "ActivationCapture", "activation_kind", "inside_compiled_call"]

ACTIVATION_COLLECTIONS = frozenset(
    {"relu_input", "relu_output", "tanh_input", "tanh_output", "sigmoid_input", "sigmoid_output"}
)


def _functions(owner: Any, names: tuple[str, ...]) -> list[Any]:
    return [function for name in names if (function := getattr(owner, name, None)) is not None]


def _kind_table() -> dict[Any, str]:
    # The ReLU family: an output is > 0 exactly where the input is > 0 (GELU, SiLU and ELU up to
    # their small negative tail), so DeadRelu's "never > 0" means the same for all of them.
    relu_like = ("relu", "relu_", "relu6", "leaky_relu", "leaky_relu_", "gelu", "elu", "elu_", "silu", "selu")
    table: dict[Any, str] = {}
    for kind, names in (("relu", relu_like), ("tanh", ("tanh", "tanh_")), ("sigmoid", ("sigmoid", "sigmoid_"))):
        for owner in (torch, F, torch.Tensor, torch._C._nn):
            for function in _functions(owner, names):
                table[function] = kind
    return table


_KINDS: dict[Any, str] | None = None


def activation_kind(function: Any) -> str | None:
    """``relu``/``tanh``/``sigmoid`` for an activation function or tensor method, else None."""
    global _KINDS
    if _KINDS is None:
        _KINDS = _kind_table()
    try:
        return _KINDS.get(function)
    except TypeError:  # an unhashable callable: not one of ours
        return None


def inside_compiled_call(max_depth: int = 40) -> bool:
    """Whether this Python call runs under a ``torch.compile``d function or module.

    A torch-function mode inside a compiled region would be traced by Dynamo (recompiling the
    model and breaking its graph at every operation), so functional activations are not
    captured there. Only looked at on the steps that would capture them.
    """
    frame = sys._getframe(1)
    depth = 0
    # The hook's callbacks run under torch.compiler.disable (see hooks/pytorch.py ``eager``),
    # whose wrapper frames are the first Dynamo frames above them: skip that group; any Dynamo
    # frame further up belongs to a compiled caller.
    groups = 0
    inside = False
    while frame is not None and depth < max_depth:
        dynamo = "_dynamo" in frame.f_code.co_filename
        if dynamo and not inside:
            groups += 1
            if groups > 1:
                return True
        inside = dynamo
        frame = frame.f_back
        depth += 1
    return False


class ActivationCapture(TorchFunctionMode):
    """Calls ``on_activation(function, kind, args, kwargs)`` for activation calls; runs every
    other torch function unchanged. Inside ``__torch_function__`` the mode is off, so the
    callback's own torch calls are not intercepted."""

    def __init__(self, on_activation: Callable[[Any, str, tuple[Any, ...], dict[str, Any]], Any]) -> None:
        super().__init__()
        self._on_activation = on_activation

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        kind = activation_kind(func)
        if kind is None:
            return func(*args, **kwargs)
        return self._on_activation(func, kind, args, kwargs)
