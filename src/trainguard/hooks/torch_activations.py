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
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from trainguard.config import loss_kinds
from trainguard.hooks.fail_open import fail_open
from trainguard.hooks.torch_global_hooks import register_global_forward_hook, register_global_forward_pre_hook
from trainguard.hooks.torch_part import CoreSwitch, HookPart

__all__ = [
    "ACTIVATION_COLLECTIONS",
    "ActivationCapture",
    "ActivationWatch",
    "activation_kind",
    "inside_compiled_call",
    "has_class_targets",
    "is_loss_module",
    "typed_memberships",
]

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
    frame: FrameType | None = sys._getframe(1)
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


# Activation modules whose inputs/outputs go to SageMaker's per-activation collections.
_ACTIVATION_KINDS: tuple[tuple[tuple[type, ...], str], ...] = (
    ((torch.nn.ReLU, torch.nn.ReLU6), "relu"),
    ((torch.nn.Tanh,), "tanh"),
    ((torch.nn.Sigmoid,), "sigmoid"),
)
_ACTIVATION_MODULES: tuple[type, ...] = tuple(t for types, _ in _ACTIVATION_KINDS for t in types)


def is_loss_module(module: torch.nn.Module) -> bool:
    # By class name, as smdebug's losses regex does: no private torch base class needed.
    return type(module).__name__.endswith("Loss")


def has_class_targets(loss: torch.nn.Module | str) -> bool:
    """Whether a loss module (or ``torch.nn.functional`` loss, by name) compares predictions with
    class labels (see :mod:`trainguard.config.loss_kinds`)."""
    return loss_kinds.has_class_targets(loss if isinstance(loss, str) else type(loss).__name__)


class ActivationCore(CoreSwitch, Protocol):
    """What the activation watch reads of the hook: the step's due collections and its names."""

    saving_this_step: bool
    _due: frozenset[str]
    _light_worker: bool  # a rank > 0 under include_workers="one": saves no activations

    def module_name(self, module: torch.nn.Module) -> str: ...

    def add_membership(self, tensor_name: str, collection_name: str) -> None: ...


class ActivationWatch(HookPart):
    """Watches functional activations during a saved step's root forward.

    It knows the running module from global hooks of its own while it watches, or, given one
    (:meth:`share_stack`), from a module stack the hook keeps anyway (the zero-code hook's)."""

    __slots__ = ("_save", "_mode", "root", "_calls", "_stack", "_own_stack", "_stack_handles")

    _core: ActivationCore

    def __init__(self, core: ActivationCore, save: Callable[[str, torch.Tensor], bool]) -> None:
        super().__init__(core)
        self._save = save
        self._mode: ActivationCapture | None = None
        self.root: torch.nn.Module | None = None  # the root whose forward is watched
        self._calls: dict[tuple[str, str], int] = {}
        self._stack: list[torch.nn.Module] = []
        self._own_stack = True
        self._stack_handles: list[Any] = []

    @property
    def active(self) -> bool:
        return self._mode is not None

    def share_stack(self, stack: list[torch.nn.Module]) -> None:
        """Read the running module from ``stack``, kept by the hook, instead of tracking it."""
        self._stack = stack
        self._own_stack = False

    def start(self, root: torch.nn.Module) -> None:
        """Watch activation calls during this root forward, if the step saves any of them."""
        if self._mode is not None:
            self.stop()  # left over from a forward that raised
        core = self._core
        if not (core.saving_this_step and core._due & ACTIVATION_COLLECTIONS) or core._light_worker:
            return
        if inside_compiled_call():
            return
        self._calls.clear()
        self.root = root
        if self._own_stack:
            self._stack_handles.append(register_global_forward_pre_hook(self._push_module))
            self._stack_handles.append(register_global_forward_hook(self._pop_module, always_call=True))
        mode = ActivationCapture(self._on_activation)
        mode.__enter__()
        self._mode = mode

    def stop(self) -> None:
        mode, self._mode = self._mode, None
        self.root = None
        handles, self._stack_handles = self._stack_handles, []
        for handle in handles:
            handle.remove()
        if self._own_stack:
            self._stack.clear()
        if mode is not None:
            try:
                mode.__exit__(None, None, None)
            except Exception as error:  # noqa: BLE001 - someone else's mode on top: never break training
                self.disable(error)

    def _push_module(self, module: torch.nn.Module, args: Any) -> None:
        self._stack.append(module)

    def _pop_module(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._stack and self._stack[-1] is module:
            self._stack.pop()

    def _current_module(self) -> torch.nn.Module | None:
        return self._stack[-1] if self._stack else self.root

    def _on_activation(self, function: Any, kind: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        names = self._activation_names(kind) if self._core.saving_this_step else None
        if names is None:
            return function(*args, **kwargs)
        tensor = args[0] if args else kwargs.get("input")
        if isinstance(tensor, torch.Tensor):
            self._save_activation(names[0], tensor)  # before the call: in-place variants overwrite it
        result = function(*args, **kwargs)
        if isinstance(result, torch.Tensor):
            self._save_activation(names[1], result)
        return result

    @fail_open
    def _activation_names(self, kind: str) -> tuple[str, str] | None:
        module = self._current_module()
        if module is not None and (isinstance(module, _ACTIVATION_MODULES) or is_loss_module(module)):
            return None  # nn.ReLU & co are captured as module I/O; a loss's internals are not activations
        scope = self._core.module_name(module) if module is not None else "functional"
        key = (scope, kind)
        index = self._calls.get(key, 0)
        self._calls[key] = index + 1
        names = (f"{scope}.{kind}_{index}_input", f"{scope}.{kind}_{index}_output")
        self._core.add_membership(names[0], f"{kind}_input")
        self._core.add_membership(names[1], f"{kind}_output")
        return names

    @fail_open
    def _save_activation(self, name: str, tensor: torch.Tensor) -> None:
        self._save(name, tensor)


def typed_memberships(
    module: torch.nn.Module, name: str, flat_inputs: Sequence[torch.Tensor], *, is_root: bool
) -> list[tuple[str, str]]:
    """The (tensor name, collection) memberships of a module's I/O by its type: activations and
    loss inputs go into the collections rules look for (relu_output, labels...).

    Rules need to know which tensors are ReLU outputs or a loss's labels, and PyTorch's tensor
    names do not say it (``features.1_output_0``); the module's type does. The data the model is
    fed (``model_inputs``: a root module's inputs that are data, which the hook files itself, and
    integer inputs anywhere else, such as an embedding's token ids) is what the data rules read;
    ``inputs`` would also save every layer's input, each a copy of the layer before's output.
    """
    memberships: list[tuple[str, str]] = []
    if not is_root:
        for index, tensor in enumerate(flat_inputs):
            if not (tensor.is_floating_point() or tensor.is_complex()):
                memberships.append((f"{name}_input_{index}", "model_inputs"))
    kind = next((kind for types, kind in _ACTIVATION_KINDS if isinstance(module, types)), None)
    if kind is not None:
        memberships += [(f"{name}_input_0", f"{kind}_input"), (f"{name}_output_0", f"{kind}_output")]
    elif is_loss_module(module) and has_class_targets(module):
        memberships += [(f"{name}_input_0", "predictions"), (f"{name}_input_1", "labels")]
    return memberships
