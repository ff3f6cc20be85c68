"""Shared pieces of the tensor rules: which steps are ready, which tensors to read, safe statistics.

Every rule here runs on live runs too, so each helper tolerates what a live run can show: a
step still being written, a tensor saved at some steps only, empty or non-finite values.
"""

from __future__ import annotations

import bisect
import re
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from trainguard.errors import StepUnavailable, TensorUnavailable, TensorUnavailableForStep, TrialError
from trainguard.modes import ModeKeys
from trainguard.rules.read_cache import shared_stat

__all__ = [
    "activation_axes",
    "all_finite",
    "as_float",
    "fmt",
    "is_complete",
    "model_inputs",
    "read_values",
    "select",
    "training_mode",
]


def is_complete(trial: Any, step: int) -> bool:
    """True when every worker finished writing global ``step`` (never read a step mid-write)."""
    try:
        return step in trial._state.steps and trial._state.is_complete(step)
    except AttributeError:  # another trial implementation: fall back to the public API
        return step in trial.steps()


def training_mode(trial: Any) -> ModeKeys:
    """TRAIN when the run has TRAIN steps, else GLOBAL (SageMaker's WeightUpdateRatio rule)."""
    state = getattr(trial, "_state", None)
    if state is not None and hasattr(state, "by_mode"):
        trial.refresh()
        return ModeKeys.TRAIN if state.by_mode[ModeKeys.TRAIN] else ModeKeys.GLOBAL
    return ModeKeys.TRAIN if trial.steps(mode=ModeKeys.TRAIN) else ModeKeys.GLOBAL


def step_in_mode(trial: Any, step: int, mode: ModeKeys) -> bool:
    return mode == ModeKeys.GLOBAL or trial.mode(step) == mode


def select(
    rule: Any,
    step: int,
    *,
    collections: Iterable[str] | None = None,
    regex: str | Sequence[str] | None = None,
) -> list[str]:
    """Tensor names saved at ``step`` in the union of ``collections`` and ``regex``.

    Unlike :meth:`Rule.select_tensors`, an empty selection is empty (not "every tensor").
    """
    trial = rule.base_trial
    names: set[str] = set()
    known = trial.collections()
    for collection in collections or ():
        if collection in known:
            names.update(trial.tensor_names(collection=collection))
    patterns = [regex] if isinstance(regex, str) else list(regex or ())
    if patterns:
        names.update(trial.tensor_names(regex=patterns))
    return sorted(name for name in names if saved_at(trial, name, step))


# Tensors that describe other tensors, not values of the model: the replica fingerprints' rows
# (hashes, and in files of earlier versions NaN where a parameter had no gradient) are read by
# ReplicaDivergence alone
_BOOKKEEPING_PREFIXES = ("replica_fingerprint/",)


def names_at(trial: Any, step: int) -> list[str]:
    """Every tensor of the model whose raw value was saved at global ``step`` (every saved tensor
    but the replica fingerprints)."""
    return [
        name for name in trial.tensor_names()
        if not name.startswith(_BOOKKEEPING_PREFIXES) and saved_at(trial, name, step)
    ]  # fmt: skip


def saved_at(trial: Any, name: str, step: int) -> bool:
    """Whether ``name``'s raw value was saved at global ``step`` (O(1) on a trainguard trial)."""
    state = getattr(trial, "_state", None)
    if state is not None and hasattr(state, "tensors"):
        return step in state.tensors.get(name, ())
    return name in trial.tensor_names(step=step)


def read_values(trial: Any, names: Sequence[str], step: int) -> dict[str, np.ndarray]:
    """Values of ``names`` at global ``step`` in one batched read; tensors missing there are left out."""
    if not names:
        return {}
    try:
        return trial.tensor_values(list(names), step)
    except (TensorUnavailable, TensorUnavailableForStep, StepUnavailable):
        pass
    values = {}
    for name in names:  # some of them are not at this step: read one by one, skipping those
        try:
            values.update(trial.tensor_values([name], step))
        except (TensorUnavailable, TensorUnavailableForStep, StepUnavailable):
            continue
    return values


def as_float(value: Any) -> np.ndarray | None:
    """``value`` as float64, or None for non-numeric (strings, objects) values."""
    array = np.asarray(value)
    if array.dtype.kind in "fiub":
        return array.astype(np.float64, copy=False)
    if array.dtype.kind == "c":
        return np.abs(array).astype(np.float64)
    return None


def surely_finite(array: np.ndarray) -> bool:
    """True only if every element of the float/complex ``array`` is finite; one pass, no temporary.

    Any NaN or inf makes a sum non-finite, so a finite sum proves the array finite. The sum in
    the array's own precision is the fast one (no conversion); when it overflows (large finite
    values, or a real NaN/inf) the float64 sum decides: float16/32 values cannot overflow it.
    False can still be wrong for float64 data near its limits: callers then check per element.
    """
    with np.errstate(all="ignore"):
        if np.isfinite(np.sum(array)):
            return True
        return bool(np.isfinite(np.sum(array, dtype=np.complex128 if array.dtype.kind == "c" else np.float64)))


def all_finite(trial: Any, step: int, name: str, value: Any) -> bool:
    """Whether every element of tensor ``name`` read at global ``step`` (``value``) is finite.

    Shared between the rules evaluated on the same step (see read_cache.shared_stat): integer
    and boolean tensors are finite, strings and objects are not numbers (False)."""
    array = np.asarray(value)
    kind = array.dtype.kind
    if kind in "iub":
        return True
    if kind not in "fc":
        return False

    def compute() -> bool:
        return array.size == 0 or surely_finite(array) or bool(np.all(np.isfinite(array)))

    return bool(shared_stat(trial, step, name, "all_finite", compute))


def is_integer(value: Any) -> bool:
    return np.asarray(value).dtype.kind in "iub"


def activation_axes(array: np.ndarray) -> np.ndarray:
    """Reshape an activation to (samples, nodes).

    Nodes are features (2-D ``N×F``, last axis of 3-D ``N×T×F`` sequences) or channels (4-D/5-D
    ``N×C×…``, PyTorch's layout: a convolution's node is its channel, its samples are every
    position of every example). A 1-D tensor is one sample of nodes.
    """
    if array.ndim <= 1:
        return array.reshape(1, -1)
    if array.ndim in (4, 5):
        moved = np.moveaxis(array, 1, -1)
        return moved.reshape(-1, array.shape[1])
    return array.reshape(-1, array.shape[-1])


def model_inputs(trial: Any, step: int) -> list[str]:
    """The model's input tensors saved at ``step``: ``<root module>_input_N`` of registered roots,
    and the members of the hook's ``model_inputs`` collection.

    The PyTorch hook names a root module's parameters ``<Root>_<param path>`` and its inputs
    ``<Root>_input_N``; a root is therefore an input prefix that also prefixes a saved weight,
    bias or gradient name. Without saved parameters, roots are told by their name: a class name
    (``Net``, ``Sequential``) starts with a capital letter, child paths (``fc1``, ``0``) do not.
    Loss-module inputs (predictions/labels) are never model inputs, nor is an input equal to
    another root's output of the same step: a chain of models (a VAE's ``mu(encoder(x))``, a
    GAN's ``D(G(z).detach())``) feeds one model's activations to the next, not data.
    """
    inputs = [name for name in names_at(trial, step) if re.search(r"_input_\d+$", name)]
    known = trial.collections()
    parameters: set[str] = set()
    for collection in ("weights", "biases", "gradients"):
        if collection in known:
            parameters.update(name.removeprefix("gradient/") for name in trial.tensor_names(collection=collection))
    excluded: set[str] = set()
    for collection in ("labels", "predictions"):
        if collection in known:
            excluded.update(trial.tensor_names(collection=collection))
    # What the hook itself filed as the model's inputs (collection model_inputs: a PyTorch root's
    # inputs, a Keras model's, whose parameter names do not start with the model's name)
    fed = set(trial.tensor_names(collection="model_inputs")) if "model_inputs" in known else set()
    found = []
    for name in inputs:
        root = re.sub(r"_input_\d+$", "", name)
        if name in excluded or root.endswith("Loss") or "." in root:
            continue
        if name in fed:
            found.append(name)
        elif parameters:
            if any(parameter.startswith(root + "_") for parameter in parameters):
                found.append(name)
        elif root[:1].isupper():
            found.append(name)
    return sorted(_without_chained_inputs(trial, step, found))


def _without_chained_inputs(trial: Any, step: int, inputs: list[str]) -> list[str]:
    if not inputs:
        return inputs
    # Outputs of model-level modules (class names: capitalised, no child path), whether or not
    # their parameters are known yet to a live reader.
    outputs = [name for name in names_at(trial, step) if re.match(r"^[A-Z][^.]*_output_\d+$", name)]
    if not outputs:
        return inputs
    values = read_values(trial, [*inputs, *outputs], step)
    kept = []
    for name in inputs:
        root = re.sub(r"_input_\d+$", "", name)
        value = values.get(name)
        chained = value is not None and any(
            not output.startswith(root + "_output_")
            and (other := values.get(output)) is not None
            and other.shape == value.shape
            and np.array_equal(other, value)
            for output in outputs
        )
        if not chained:
            kept.append(name)
    return kept


def fmt(value: float | None) -> str:
    """A number for a finding's message: short, exact enough to compare with a threshold."""
    if value is None:
        return "None"
    if not np.isfinite(value):
        return str(value)
    return f"{value:.4g}"


def safe_mode(trial: Any, step: int) -> ModeKeys | None:
    try:
        return trial.mode(step)
    except TrialError:
        return None


_SORTED_STEPS: weakref.WeakKeyDictionary[Any, dict[str, tuple[int, list[int]]]] = weakref.WeakKeyDictionary()


def _sorted_saved_steps(trial: Any, name: str) -> list[int]:
    """Global steps with ``name``'s raw value, sorted; re-sorted only when the run grew."""
    state = getattr(trial, "_state", None)
    if state is None or not hasattr(state, "tensors"):
        try:
            return trial.tensor(name).steps()
        except TrialError:
            return []
    steps = state.tensors.get(name, {})
    cache = _SORTED_STEPS.setdefault(trial, {})
    hit = cache.get(name)
    if hit is None or hit[0] != len(steps):
        hit = (len(steps), sorted(steps))
        cache[name] = hit
    return hit[1]


def earlier_steps(
    trial: Any,
    name: str,
    step: int,
    keep: Callable[[int], bool],
    *,
    stop: Callable[[int], bool] | None = None,
    limit: int | None = None,
) -> list[int]:
    """Complete saved steps of ``name`` before ``step`` with ``keep(p)``, newest first.

    The walk back ends at the first kept step with ``stop(p)`` or after ``limit`` steps found; it
    costs O(log n + steps visited), not O(n) per call.
    """
    ordered = _sorted_saved_steps(trial, name)
    found: list[int] = []
    for index in range(bisect.bisect_left(ordered, step) - 1, -1, -1):
        p = ordered[index]
        if not keep(p) or not is_complete(trial, p):
            continue
        if stop is not None and stop(p):
            break
        found.append(p)
        if limit is not None and len(found) >= limit:
            break
    return found


class ChannelStats:
    """Running per-channel mean/std of a tensor over steps (finite values only).

    ``channel`` is the axis holding channels/features; every other axis is pooled.
    """

    def __init__(self) -> None:
        self.samples = 0
        self.count: np.ndarray | None = None
        self.total: np.ndarray | None = None
        self.squares: np.ndarray | None = None

    def add(self, array: np.ndarray, channel: int) -> bool:
        """Add one batch; False (and nothing added) when its channel count differs from earlier ones."""
        if array.ndim == 0 or array.size == 0:
            return False
        moved = np.moveaxis(array, channel, -1).reshape(-1, array.shape[channel])
        finite = np.isfinite(moved)
        values = np.where(finite, moved, 0.0)
        if self.count is not None and self.count.shape[0] != moved.shape[1]:
            return False
        count, total, squares = finite.sum(axis=0), values.sum(axis=0), (values * values).sum(axis=0)
        if self.count is None:
            self.count, self.total, self.squares = count, total, squares
        else:
            self.count, self.total, self.squares = self.count + count, self.total + total, self.squares + squares
        self.samples += array.shape[0] if channel != 0 else 1
        return True

    def means(self) -> np.ndarray:
        assert self.count is not None and self.total is not None
        return self.total / np.maximum(self.count, 1)

    def stds(self) -> np.ndarray:
        assert self.count is not None and self.squares is not None
        mean = self.means()
        return np.sqrt(np.maximum(self.squares / np.maximum(self.count, 1) - mean * mean, 0.0))

    def pooled_std(self) -> float:
        assert self.count is not None and self.total is not None and self.squares is not None
        n = max(float(self.count.sum()), 1.0)
        mean = float(self.total.sum()) / n
        return float(np.sqrt(max(float(self.squares.sum()) / n - mean * mean, 0.0)))


def channel_axis(array: np.ndarray, channel: int | None) -> int:
    """The channel axis: ``channel`` if given (negative counts from the end), else axis 1 of
    2-D/4-D/5-D tensors (features; NCHW) and the last axis of 3-D sequences."""
    if channel is not None:
        return channel if channel >= 0 else array.ndim + channel
    if array.ndim == 1:
        return 0
    return array.ndim - 1 if array.ndim == 3 else 1


def check_regexes(rule: Any, parameter: str) -> None:
    """Raise ConfigError naming ``parameter`` when one of its regexes does not compile."""
    from trainguard.errors import ConfigError

    value = getattr(rule, parameter)
    for pattern in [value] if isinstance(value, str) else list(value or ()):
        try:
            re.compile(pattern)
        except re.error as error:
            raise ConfigError(
                f"{rule.name()}: parameter {parameter}={pattern!r} is not a valid regular expression: {error}"
            ) from None
