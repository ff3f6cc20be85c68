"""Getting tensors out of a Keras 3 model mid-step, per backend, only on the steps that save.

Two mechanisms, both installed for one saved step and removed at its end, so unsaved steps run
Keras's own code untouched:

* **Layer spies** replace a layer's ``call`` by a wrapper (an instance attribute that shadows the
  class method) which passes the call through and hands the layer's inputs and outputs over. On
  the torch backend the forward is eager: the spies see real tensors of the real training
  forward. On JAX they are installed while a *capturing variant* of the train step (a *probe*
  of the test/predict step) is traced, and emit each tensor with ``jax.debug.callback``, which
  also works inside ``jax.value_and_grad``: in training, the values of the real forward,
  delivered to the host as the compiled step runs.
* **Gradients**: on torch, Keras's ``train_step`` leaves each variable's gradient in ``.grad``
  until the next step zeroes it: reading it at batch end costs nothing. On JAX the capturing
  variant of ``train_step`` wraps ``optimizer.stateless_apply`` while it is traced and returns
  the gradients it was given as an extra output of the compiled step: exactly the gradients the
  optimizer applies, without a second forward or backward pass. The variant is compiled once,
  on the first saved step, and used on saved steps only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from trainguard.format.tensor_codec import DT_BFLOAT16

__all__ = [
    "HostArray",
    "LayerSpies",
    "emit_with_jax_callback",
    "host_array",
    "is_torch_tensor",
    "jax_capture_variant",
    "tensors_in",
]

BACKEND = keras.backend.backend()

HostArray = tuple[np.ndarray, int | None]  # array, DataType override


def is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch")


def host_array(value: Any) -> HostArray:
    """A host copy of a JAX/NumPy/TF array (never a view the framework may reuse or donate)."""
    if isinstance(value, keras.Variable):
        value = value.value
    array = np.array(keras.ops.convert_to_numpy(value) if BACKEND == "tensorflow" else value, copy=True)
    if array.dtype.name == "bfloat16":  # numpy has no bfloat16: ship the bits, tag the type
        return array.view(np.uint16), DT_BFLOAT16
    if array.dtype.kind == "V" or array.dtype.name.startswith("float8"):
        return array.astype(np.float32), None
    return array, None


# Activations whose inputs the rules read (DeadRelu: relu; SaturatedActivation: tanh, sigmoid).
SPIED_ACTIVATIONS = ("relu", "tanh", "sigmoid")


def activation_function(layer: Any) -> Any:
    """The layer's own ``activation=`` function when it is one the rules read, else None."""
    function = getattr(layer, "activation", None)
    return function if callable(function) and getattr(function, "__name__", None) in SPIED_ACTIVATIONS else None


def tensors_in(structure: Any) -> list[Any]:
    """The tensors of a (possibly nested) layer input or output, in flattening order."""
    try:
        leaves = keras.tree.flatten(structure)
    except Exception:  # noqa: BLE001 - an exotic structure: look no further than its top level
        leaves = list(structure) if isinstance(structure, (list, tuple)) else [structure]
    return [leaf for leaf in leaves if hasattr(leaf, "shape") and hasattr(leaf, "dtype")]


# A spy reports (layer name, "input"|"output", index, tensor) for each tensor it sees.
Emit = Callable[[str, str, int, Any], None]


class LayerSpies:
    """Wraps ``call`` of the given layers while active; ``remove()`` restores them."""

    def __init__(
        self, layers: list[tuple[str, Any]], wanted: Callable[[str], bool], on_error: Callable[[BaseException], None]
    ) -> None:
        self._layers = layers
        self._wanted = wanted  # tensor name -> whether to capture it
        self._on_error = on_error
        self._installed: list[Any] = []
        self._activations: list[tuple[Any, Any]] = []  # (layer, its own activation function)

    def install(self, emit: Emit) -> None:
        for name, layer in self._layers:
            self._spy_activation(name, layer, emit)
            want_inputs = self._wanted(f"{name}_input_0")
            want_outputs = self._wanted(f"{name}_output_0")
            if not (want_inputs or want_outputs) or "call" in vars(layer):
                continue
            original = layer.call
            object.__setattr__(layer, "call", self._spy(name, original, emit, want_inputs, want_outputs))
            self._installed.append(layer)

    def _spy(
        self, name: str, original: Callable[..., Any], emit: Emit, want_inputs: bool, want_outputs: bool
    ) -> Callable[..., Any]:
        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            outputs = original(*args, **kwargs)
            try:
                if want_inputs and args:
                    for index, tensor in enumerate(tensors_in(args[0])):
                        emit(name, "input", index, tensor)
                if want_outputs:
                    for index, tensor in enumerate(tensors_in(outputs)):
                        emit(name, "output", index, tensor)
            except Exception as error:  # noqa: BLE001 - fail open: the layer's result stands
                self._on_error(error)
            return outputs

        return call

    def _spy_activation(self, name: str, layer: Any, emit: Emit) -> None:
        """Emit the input of a layer's own ``activation=`` (the pre-activation of Dense, Conv...).

        The layer's output is the activation's output; its input never leaves the layer's
        ``call``, and SaturatedActivation (tanh/sigmoid) needs exactly it. Emitted as
        ``<layer>/<activation>_input_0`` (``hidden/tanh_input_0``).
        """
        original = activation_function(layer)
        if original is None:
            return
        stem = f"{name}/{original.__name__}"
        if not self._wanted(f"{stem}_input_0"):
            return
        on_error = self._on_error

        @functools.wraps(original)
        def activation(x: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                emit(stem, "input", 0, x)
            except Exception as error:  # noqa: BLE001 - fail open: the activation still runs
                on_error(error)
            return original(x, *args, **kwargs)

        object.__setattr__(layer, "activation", activation)
        self._activations.append((layer, original))

    def remove(self) -> None:
        for layer in self._installed:
            if "call" in vars(layer):
                object.__delattr__(layer, "call")
        self._installed.clear()
        for layer, original in self._activations:
            object.__setattr__(layer, "activation", original)
        self._activations.clear()

    @property
    def active(self) -> bool:
        return bool(self._installed or self._activations)


def jax_capture_variant(
    model: Any,
    kind: str,
    spies: LayerSpies,
    emit: Emit,
    on_gradients: Callable[[Any], None],
) -> Callable[[Any, Any], Any]:
    """A JAX step for one batch that also captures tensors.

    ``kind="train"``: a replacement for Keras's train step, ``run(state, data) -> (logs,
    state)``; the compiled function also returns the gradients, handed to ``on_gradients``.
    ``kind="test"|"predict"``: a probe, ``run(state, data)``, that runs the step without keeping
    its results, only to emit layer tensors; Keras's own step then runs on the same batch (the
    price of a second forward on saved evaluation steps buys independence from how each Keras
    version shapes the results of its test and predict functions). Either way layer tensors are
    emitted through ``emit``.
    """
    import jax

    def traced(state: Any, data: Any) -> Any:
        box: dict[str, Any] = {}
        optimizer = getattr(model, "optimizer", None)
        spied_optimizer = kind == "train" and optimizer is not None
        if spied_optimizer and optimizer is not None:
            original_apply = optimizer.stateless_apply

            def stateless_apply(optimizer_variables: Any, grads: Any, trainable_variables: Any) -> Any:
                box["gradients"] = grads
                return original_apply(optimizer_variables, grads, trainable_variables)

            object.__setattr__(optimizer, "stateless_apply", stateless_apply)
        spies.install(emit)
        try:
            if kind == "train":
                outputs, new_state = model.train_step(state, data)
            elif kind == "test":
                outputs, new_state = model.test_step(state, data)
            else:
                outputs, new_state = model.predict_step(state, data)
        finally:
            spies.remove()
            if spied_optimizer and "stateless_apply" in vars(optimizer):
                object.__delattr__(optimizer, "stateless_apply")
        return outputs, new_state, box.get("gradients")

    # No buffer donation (Keras donates the state): if this step fails, Keras's own step runs
    # on the same state instead. The copy this costs is paid on saved steps only.
    compiled = jax.jit(traced) if model.jit_compile and not model.run_eagerly else traced

    def run(state: Any, data: Any) -> Any:
        outputs, new_state, gradients = compiled(state, data)
        on_gradients(gradients)
        return outputs, new_state

    return run


def emit_with_jax_callback(receive: Callable[[str, str, int, Any], None]) -> Emit:
    """An ``Emit`` for traced JAX code: the tensor reaches ``receive`` when the step runs."""
    import jax

    def emit(name: str, kind: str, index: int, tensor: Any) -> None:
        jax.debug.callback(functools.partial(receive, name, kind, index), tensor)

    return emit
