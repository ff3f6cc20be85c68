"""The Keras 3 hook: a ``keras.callbacks.Callback`` that captures a model's tensors.

Works with the torch and JAX backends. The TensorFlow backend is refused: the hook disables itself
as it is created, with one log line (it could read weights and losses there but no gradients or
layer outputs, and rules judging half a run point at the wrong cause).
One step is one batch: TRAIN for ``fit`` batches, EVAL for ``evaluate`` and the validation
batches of ``fit``, PREDICT for ``predict``. Global step numbers increase across modes.

Tensor names (``<model>`` is ``model.name``, stripped from variable paths), by collection:

* ``weights``: ``<layer>/<variable>``, non-trainable state included: ``dense/kernel``,
  ``bn/gamma``, ``bn/moving_mean``.
* ``biases``: the variables named ``*bias``: ``dense/bias``.
* ``gradients``: ``gradients/<layer>/<variable>``: ``gradients/dense/kernel``.
* ``losses``: the log keys containing ``loss``: ``loss`` (``val_`` never appears: validation
  batches are EVAL steps, whose loss is ``loss`` too), ``head_loss`` for multi-output models.
* ``metrics``: the other scalar log keys: ``accuracy``, ``mae``.
* ``outputs``: ``<layer>_output_<i>``, the model itself as a layer: ``dense_output_0``,
  ``sequential_output_0`` (in PREDICT, the predictions).
* ``inputs``: ``<layer>_input_<i>``, the tensors of the layer's first argument.
* ``scalars``: ``scalar/<name>`` from ``hook.save_scalar``.

Layers nested in models or custom layers are found too; a name used twice becomes
``<parent>/<name>`` (``block/conv_output_0``). Outputs of layers with a relu/tanh/sigmoid
activation are also members of ``relu_output``/``tanh_output``/``sigmoid_output``, and the
activation's input (the pre-activation) is saved as ``<layer>/<activation>_input_0``
(``hidden/tanh_input_0``), a member of ``relu_input``/``tanh_input``/``sigmoid_input``. Losses and
metrics are what Keras logs for the batch: the running mean over the epoch so far, as Keras
computes it. Weights are the values the step's forward pass uses (before the update), gradients
those the optimizer is given (before clipping; multiplied by the loss scale under
``LossScaleOptimizer``). Gradients and layer tensors cost something only on the steps that save
them (see ``hooks/keras_capture.py``); on JAX, the first saved step compiles a capture step once.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from trainguard.config.capture_config import DEFAULT_MAX_PENDING_BYTES, CaptureConfig
from trainguard.config.collections import DEFAULT_PYTORCH_COLLECTIONS, Collection, CollectionManager
from trainguard.config.reduction_config import ReductionConfig, reduction_tensor_name
from trainguard.config.save_config import SaveConfig
from trainguard.hooks.base import BaseHook, SavePlan
from trainguard.hooks.fail_open import fail_open
from trainguard.hooks.keras_capture import (
    BACKEND,
    LayerSpies,
    activation_function,
    emit_with_jax_callback,
    host_array,
    is_torch_tensor,
    jax_capture_variant,
)
from trainguard.hooks.keras_zero_code import SUPPORTED_BACKENDS, unsupported_backend_message
from trainguard.modes import ModeKeys
from trainguard.reductions import reduce_array

__all__ = ["KERAS_COLLECTIONS", "KerasHook", "keras_collections"]

logger = logging.getLogger("trainguard")

# Membership of weights, biases, losses and metrics is given by name as the hook meets them:
# Keras names say nothing a regex could rely on (``dense/kernel`` is a weight, ``dense/bias``
# a bias, a metric may be called anything).
KERAS_COLLECTIONS: dict[str, list[str]] = {
    **{name: list(patterns) for name, patterns in DEFAULT_PYTORCH_COLLECTIONS.items()},
    "weights": [],
    "biases": [],
    "gradients": [r"^gradients/"],
    "losses": [],
    "metrics": [],
    "sm_metrics": [],
    "optimizer_variables": [],
}
_ACTIVATIONS = ("relu", "tanh", "sigmoid")
_KINDS = {ModeKeys.TRAIN: "train", ModeKeys.EVAL: "test", ModeKeys.PREDICT: "predict"}


def keras_collections(configured: CollectionManager | None = None) -> CollectionManager:
    """Keras's default collections, with what ``configured`` adds to PyTorch's defaults.

    The JSON config reader starts from PyTorch's defaults; a Keras hook keeps the user's own
    regexes, schedules and reductions from it, not PyTorch's naming regexes.
    """
    manager = CollectionManager(Collection(name, list(patterns)) for name, patterns in KERAS_COLLECTIONS.items())
    for collection in configured or ():
        target = manager.get(collection.name)
        defaults = DEFAULT_PYTORCH_COLLECTIONS.get(collection.name, [])
        target.include([pattern for pattern in collection.include_regex if pattern not in defaults])
        target.tensor_names |= collection.tensor_names
        target.save_config = collection.save_config
        target.reduction_config = collection.reduction_config
        target.save_histogram = collection.save_histogram
    return manager


def _unique(name: str, taken: set[str]) -> str:
    candidate, index = name, 1
    while candidate in taken:
        candidate, index = f"{name}_{index}", index + 1
    taken.add(candidate)
    return candidate


def _children(layer: Any) -> list[Any]:
    """The layers directly inside ``layer``: a model's, and those of a custom layer's attributes."""
    flatten = getattr(layer, "_flatten_layers", None)  # every Keras 3 layer has it; .layers only models
    if flatten is not None:
        return list(flatten(include_self=False, recursive=False))
    return list(getattr(layer, "layers", None) or [])


class KerasHook(BaseHook, keras.callbacks.Callback):
    """Captures a Keras 3 model's tensors: pass it to ``fit``/``evaluate``/``predict`` callbacks.

    Arguments as smdebug's ``KerasHook`` (and trainguard's PyTorch ``Hook``). Close it (or use it
    as a context manager) when done; an exit handler closes it otherwise.
    """

    framework = "keras"
    default_collections = ("weights", "biases", "gradients", "losses", "metrics", "default", "scalars")
    always_included = ("losses", "metrics", "sm_metrics", "scalars")

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | None = None,
        export_tensorboard: bool = False,
        tensorboard_dir: str | None = None,
        dry_run: bool = False,
        reduction_config: ReductionConfig | None = None,
        save_config: SaveConfig | None = None,
        include_regex: Sequence[str] | str | None = None,
        include_collections: Sequence[str] | None = None,
        save_all: bool = False,
        include_workers: str = "one",
        *,
        config: CaptureConfig | None = None,
        collection_manager: CollectionManager | None = None,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        other_workers_collections: Sequence[str] | None = None,
        endpoint_url: str | None = None,
        profile: str | None = None,
        region: str | None = None,
    ) -> None:
        keras.callbacks.Callback.__init__(self)
        if config is not None:
            # the writer process and the overhead budget are the PyTorch hook's: Keras writes
            # from its own thread, on the schedule as configured
            config = config.replace(writer=None, overhead_budget=None, overhead_max_interval=None)
        super().__init__(
            out_dir, export_tensorboard, tensorboard_dir, dry_run, reduction_config, save_config,
            include_regex, include_collections, save_all, include_workers, config=config,
            collection_manager=collection_manager or keras_collections(), max_pending_bytes=max_pending_bytes,
            other_workers_collections=other_workers_collections,
            endpoint_url=endpoint_url, profile=profile, region=region,
        )  # fmt: skip
        self._named_model: Any = None
        self._weights: list[tuple[str, Any]] = []
        self._gradient_names: list[str | None] = []  # one per model.trainable_variables
        self._layers: list[tuple[str, Any]] = []
        self._spies: LayerSpies | None = None
        self._swapped: tuple[str, Any, Any] | None = None  # (model attribute, original, replacement)
        self._variants: dict[str, Any] = {}
        self._held: dict[str, tuple[SavePlan, Any, Any]] = {}
        self._received: dict[str, Any] = {}  # layer tensors from jax.debug.callback
        self._pending_gradients: Any = None
        self._received_error: BaseException | None = None
        self._pending_scalars: dict[str, float] = {}
        self._warned: set[str] = set()
        if BACKEND not in SUPPORTED_BACKENDS:
            self.disable(unsupported_backend_message(BACKEND).removeprefix("trainguard: "))

    def _rank_and_world(self) -> tuple[int, int]:
        if BACKEND == "jax":
            import jax

            return jax.process_index(), jax.process_count()
        if BACKEND == "torch":
            import torch.distributed as distributed

            if distributed.is_available() and distributed.is_initialized():
                return distributed.get_rank(), distributed.get_world_size()
        return 0, 1

    # -- model and names ----------------------------------------------------------------------
    def disable(self, reason: BaseException | str) -> None:
        self._held.clear()
        super().disable(reason)

    def set_model(self, model: Any) -> None:
        if model is not self._model:
            self._restore()
            self._variants.clear()
        super().set_model(model)

    def _ensure_names(self, model: Any) -> None:
        if self._named_model is model:
            return
        prefix = f"{model.name}/"
        taken: set[str] = set()
        self._weights = []
        for variable in [*model.trainable_variables, *model.non_trainable_variables]:
            if "float" not in str(variable.dtype):  # seed generator states, counters
                continue
            path = variable.path[len(prefix) :] if variable.path.startswith(prefix) else variable.path
            name = _unique(path, taken)
            self._weights.append((name, variable))
            self.add_membership(name, "biases" if variable.name.endswith("bias") else "weights")
        names = {id(variable): name for name, variable in self._weights}
        self._gradient_names = [
            f"gradients/{names[id(variable)]}" if id(variable) in names else None
            for variable in model.trainable_variables
        ]
        layer_names: set[str] = set()
        self._layers = []
        pending = [(model, "")]
        while pending:
            layer, parent = pending.pop(0)
            qualified = f"{parent}/{layer.name}" if parent and layer.name in layer_names else layer.name
            name = _unique(qualified, layer_names)
            self._layers.append((name, layer))
            if layer is model or isinstance(layer, keras.layers.Embedding):
                # what the model is fed (the model's own inputs; an embedding's token ids): the
                # data rules' collection, without every layer's input that "inputs" holds
                self.collection_manager.get("model_inputs").include(rf"^{re.escape(name)}_input_\d+$")
                self._collections_dirty = True
                self._match_cache.clear()
                self._plan_cache.clear()
            activation = getattr(getattr(layer, "activation", None), "__name__", None)
            if activation in _ACTIVATIONS:
                self.add_membership(f"{name}_output_0", f"{activation}_output")
                # the pre-activation, emitted by LayerSpies while the layer's activation runs
                self.add_membership(f"{name}/{activation}_input_0", f"{activation}_input")
            pending.extend((child, name if layer is not model else "") for child in _children(layer))
        wanted = self._wanted_now if BACKEND == "torch" else self._wanted_ever
        self._spies = LayerSpies(self._layers, wanted, self.disable)
        self._named_model = model

    def add_membership(self, tensor_name: str, collection_name: str) -> None:
        """Make ``tensor_name`` a member of a collection without including the collection."""
        collection = self.collection_manager.get(collection_name)
        if tensor_name in collection.tensor_names:
            return
        collection.add_tensor_name(tensor_name)
        self._collections_dirty = True
        self._match_cache.pop(tensor_name, None)
        self._plan_cache.clear()

    def _wanted_now(self, name: str) -> bool:
        return self.plan(name) is not None

    def _wanted_ever(self, name: str) -> bool:
        # A compiled capture step is reused on later saved steps: it emits every tensor some
        # included collection takes; what is due at a step is decided when it is written.
        return bool(self._matching(name))

    # -- Keras callback events ------------------------------------------------------------------
    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_begin(ModeKeys.TRAIN)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_end(logs)

    def on_test_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_begin(ModeKeys.EVAL)

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_end(logs)

    def on_predict_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_begin(ModeKeys.PREDICT)

    def on_predict_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_end(None)  # the predictions are the model's output: `<model>_output_0`

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._finish()

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        self._finish()

    def on_predict_end(self, logs: dict[str, Any] | None = None) -> None:
        self._finish()

    @fail_open
    def _batch_begin(self, mode: ModeKeys) -> None:
        if mode != self.mode:
            self.set_mode(mode)
        self.begin_step()

    def _batch_end(self, logs: dict[str, Any] | None) -> None:
        try:
            self._collect(logs)
        finally:
            self._restore()
            self._end()

    @fail_open
    def _end(self) -> None:
        self.end_step()

    @fail_open
    def _finish(self) -> None:
        self._restore()
        self.end_step()  # written in the background: training does not wait for it

    # -- a saved step -----------------------------------------------------------------------------
    def _on_step_begin(self) -> None:
        model = self._model
        if model is None:
            return
        self._ensure_names(model)
        if hasattr(model, "jax_state_sync"):
            # Mid-epoch, the JAX trainer keeps the state out of the variables; put it back.
            model.jax_state_sync()
        for name, variable in self._weights:
            self.capture(name, variable.value)
        self._start_capture(model)

    def _start_capture(self, model: Any) -> None:
        assert self._spies is not None
        wants_layers = any(
            self._wanted_now(f"{name}_{kind}_0") for name, _ in self._layers for kind in ("input", "output")
        ) or any(
            self._wanted_now(f"{name}/{function.__name__}_input_0")
            for name, layer in self._layers
            if (function := activation_function(layer)) is not None
        )
        if BACKEND == "torch":
            if wants_layers and not model.jit_compile:
                self._spies.install(self._receive_eager)
            elif wants_layers:
                self._warn_once("torch-compile", "layer inputs/outputs are not captured under jit_compile=True")
            return
        if BACKEND != "jax":
            return
        wants_gradients = self.mode == ModeKeys.TRAIN and any(
            self._wanted_now(name) for name in self._gradient_names if name
        )
        if wants_layers or wants_gradients:
            self._swap(model, _KINDS.get(self.mode, "train"))

    def _swap(self, model: Any, kind: str) -> None:
        attribute = f"{kind}_function"
        original = getattr(model, attribute, None)
        if original is None:
            return
        if model.steps_per_execution > 1:
            self._warn_once("steps", "gradients and layer tensors need steps_per_execution=1 with the JAX backend")
            return
        run = self._variants.get(kind)
        if run is None:
            assert self._spies is not None
            emit = emit_with_jax_callback(self._receive_traced)
            run = self._variants[kind] = jax_capture_variant(model, kind, self._spies, emit, self._receive_gradients)

        def function(state: Any, batches: Any) -> Any:
            if not self.enabled:
                return original(state, batches)
            # Recent Keras passes an iterator of batches, earlier 3.x versions a list of them.
            iterator_style = hasattr(batches, "__next__")
            data = next(batches) if iterator_style else batches[0]
            same_batches = iter([data]) if iterator_style else batches
            try:
                if kind == "train":
                    return run(state, data)
                run(state, data)  # a probe: Keras's own step follows
            except Exception as error:  # noqa: BLE001 - fail open: run Keras's own step instead
                self.disable(error)
            return original(state, same_batches)

        setattr(model, attribute, function)
        self._swapped = (attribute, original, function)

    def _restore(self) -> None:
        """Undo the step's spies and swapped step function; safe to call at any time."""
        if self._spies is not None and self._spies.active:
            self._spies.remove()
        if self._swapped is not None:
            attribute, original, replacement = self._swapped
            self._swapped = None
            if self._model is not None and getattr(self._model, attribute, None) is replacement:
                setattr(self._model, attribute, original)

    def _receive_eager(self, name: str, kind: str, index: int, tensor: Any) -> None:
        self.capture(f"{name}_{kind}_{index}", tensor)

    def _receive_traced(self, name: str, kind: str, index: int, array: Any) -> None:
        # On a JAX runtime thread, while the compiled step runs: copy, decide later. Never
        # raise here: the error would surface as a failure of the training step itself.
        try:
            self._received[f"{name}_{kind}_{index}"] = np.array(array, copy=True)
        except Exception as error:  # noqa: BLE001
            self._received_error = error

    def _receive_gradients(self, gradients: Any) -> None:
        self._pending_gradients = gradients

    @fail_open
    def _collect(self, logs: dict[str, Any] | None) -> None:
        if not self.saving_this_step:
            self._received.clear()
            self._pending_gradients = None
            return
        for key, value in (logs or {}).items():
            number = np.asarray(value)
            if number.ndim != 0 or number.dtype.kind not in "biuf":
                continue  # not a scalar (a custom metric may log anything): not a loss or metric
            self.add_membership(key, "losses" if "loss" in key else "metrics")
            self.capture(key, number.astype(np.float64))
        model = self._model
        if self.mode == ModeKeys.TRAIN and model is not None and BACKEND == "torch":
            # Keras's torch train_step leaves the gradients in .grad until the next step.
            for name, variable in zip(self._gradient_names, model.trainable_variables, strict=False):
                gradient = variable.value.grad
                if name is not None and gradient is not None:
                    self.capture(name, gradient)
        gradients, self._pending_gradients = self._pending_gradients, None
        if gradients is not None:
            for name, gradient in zip(self._gradient_names, gradients, strict=False):
                if name is not None and gradient is not None:
                    self.capture(name, gradient)
        if self._swapped is not None and BACKEND == "jax":
            import jax

            jax.effects_barrier()  # every jax.debug.callback of the step has run
        error, self._received_error = self._received_error, None
        if error is not None:
            raise error
        received, self._received = self._received, {}
        for name, array in received.items():
            self.capture(name, array)

    # -- saving -----------------------------------------------------------------------------------
    def capture(self, name: str, value: Any) -> None:
        """Save ``value`` as ``name`` at the end of this step, if due; a later value replaces it."""
        plan = self.plan(name)
        if plan is None:
            return
        if is_torch_tensor(value):
            from trainguard.hooks.torch_tensors import reduce_on_device, snapshot

            raw = snapshot(value) if plan.save_raw else None
            reduced = reduce_on_device(value, plan.reductions) if plan.reductions else None
        else:
            array, proto_dtype = host_array(value)
            raw = (array, array.nbytes, proto_dtype) if plan.save_raw else None
            reduced = None
            if plan.reductions:
                numeric = array if proto_dtype is None else np.asarray(value, dtype=np.float32)
                requested = plan.reductions
                reduced = (lambda: reduce_array(numeric, requested), 8 * len(requested), None)
        self._held[name] = (plan, raw, reduced)

    def _on_step_end(self) -> None:
        scalars, self._pending_scalars = self._pending_scalars, {}
        for name, value in scalars.items():  # whatever the schedule of the scalars collection
            self.write_tensor(name, np.array([value], dtype=np.float64), nbytes=8)
        held, self._held = self._held, {}
        for name, (plan, raw, reduced) in held.items():
            if raw is not None:
                self.write_tensor(name, raw[0], nbytes=raw[1], proto_dtype=raw[2])
            if reduced is not None and reduced[0] is not None and self._writer is not None:
                names = [
                    reduction_tensor_name(name, reduction, absolute=absolute) for reduction, absolute in plan.reductions
                ]
                self._writer.add_reductions(names, reduced[0])

    # -- user API -----------------------------------------------------------------------------------
    @fail_open
    def save_scalar(self, name: str, value: Any, sm_metric: bool = False) -> None:
        """Save a number as ``scalar/<name>`` with the current step if it saves, else the next that does."""
        tensor_name = f"scalar/{name}"
        if sm_metric:
            self.add_membership(tensor_name, "sm_metrics")
        self._pending_scalars[tensor_name] = float(keras.ops.convert_to_numpy(value))

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("trainguard: %s", message)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything captured so far is written. False on timeout."""
        return self._writer.flush(timeout) if self._writer is not None else True

    def close(self) -> None:
        self._restore()
        super().close()
