"""NotNormalizedData (trainguard; not a SageMaker rule): over the model's input batches accumulated since
the start, with per-channel mean μ_c and standard deviation σ_c (channels: axis 1 of N×C×H×W images
and N×F tables, the last axis of N×T×F sequences, or ``channel``) and the pooled σ of all values,
once ≥ ``threshold_samples`` samples were seen (earlier, from 16 samples, when a bound holds by 4 standard
errors): fire if ``∃c: |μ_c| > threshold_mean`` or
``∃c: σ_c > threshold_std`` or ``σ_pooled < 1/threshold_std``.

Defaults are deliberately loose (threshold_mean 1.0, threshold_std 5.0, 100 samples): inputs
min-max scaled to [0, 1] (μ ≈ 0.5, σ ≈ 0.3) count as normalised, features in the tens or
thousands and data squashed to σ < 0.2 do not. A single binary or rare feature has a small σ
of its own, so the lower bound uses the pooled σ. CheckInputImages is the SageMaker-named,
stricter, mean-only check for images.

Binary indicator features (every value 0 or 1: multi-hot bag-of-words, one-hot categories,
presence flags) need no standardisation: such channels are not judged, and the pooled-σ lower
bound applies only to the non-binary channels (a multi-label net on sparse multi-hot inputs is
healthy).

Inputs that stopped carrying information: the statistics accumulate since the start, so inputs
that turn all zero (or any one constant) mid-run hide behind the earlier batches. A tensor whose
last ``threshold_samples`` samples or more all held one and the same value fires too (a broken
data pipeline, a mask applied to everything); a batch with some all-zero rows is not constant.

Row-normalised inputs (every sample's features non-negative and summing to 1, or of unit L2
norm; all-zero rows allowed): a graph network's ``D⁻¹X`` node features, term frequencies, L2-
normalised embeddings. Their values are small because there are many features (measured: σ 0.006
over 1,433 features), not because the data was squashed: the pooled-σ lower bound does not
apply to them (the upper bounds cannot fire, every value is within [-1, 1]). An N×N input next
to another input of N samples (a graph's normalised adjacency ``D^-½(A+I)D^-½``, an affinity or
attention matrix) relates the samples to each other: it has no features to scale and is not judged.

What cannot be told apart: an engineered feature of a regression on a larger scale (x⁴ of a
standard normal x has mean 3 and σ ≈ 10) and a raw feature left unscaled at the same scale. Both
are reported, as advice (trainguard.rules.advice): a property of the data, not a fault by
itself; it becomes a finding, and a candidate cause, when the run shows a learning symptom (SGD
diverging on that feature's scale). Features on scales thousands apart, raw 0-255 pixels,
constant inputs are reported the same way, with the numbers that tell how far off they are.

Tensors: ``tensor_regex`` ∪ ``collection_names``; with neither, the model's inputs that are data
(``<root module>_input_N`` of the PyTorch hook, saved by the ``model_inputs`` collection, less
those the hook found to be the model's own outputs fed back or tensors with autograd history:
``_data_inputs``). Integer and boolean inputs (token ids, indices) are not features and are skipped.
"""

from __future__ import annotations

import numpy as np

from trainguard.rules.base import MissingTensor, Rule, StepResult
from trainguard.rules.builtin._data_inputs import data_inputs, derived_inputs
from trainguard.rules.builtin._helpers import (
    ChannelStats,
    channel_axis,
    check_regexes,
    fmt,
    is_complete,
    read_values,
    select,
)
from trainguard.rules.params import Param

# Early judgement (before threshold_samples): at least this many samples, bounds held by this
# many standard errors.
EARLY_MIN_SAMPLES = 16
EARLY_Z = 4.0
# How close to 1 a row's L1 sum or L2 norm must be to count as normalised (float32 sums of a few
# thousand features are off by ~1e-6)
UNIT_ROW_TOLERANCE = 1e-3


class NotNormalizedData(Rule):
    """Model inputs far from zero mean / unit variance."""

    rule_name = "NotNormalizedData"
    collections = ("model_inputs",)  # the hook's collection of what the model is fed
    fix_hint = "normalise the inputs to zero mean and unit variance per feature (e.g. sklearn StandardScaler)"
    fix_hints = {
        "pytorch": (
            "normalise the inputs: torchvision.transforms.Normalize(mean, std) for images, "
            "sklearn.preprocessing.StandardScaler for tables"
        ),
        "keras": (
            "normalise the inputs: a keras.layers.Normalization layer adapted to the training data (layer.adapt(x))"
        ),
        "xgboost": "tree models need no input normalisation; this rule does not apply to them",
    }

    tensor_regex = Param(list, None, "regexes of input tensor names (default: the model's inputs)")
    collection_names = Param(list, None, "collections of input tensors")
    threshold_mean = Param(
        float,
        1.0,
        "fire when a channel's |mean| is above this",
        check=lambda value: None if value > 0 else "must be > 0",
    )
    threshold_std = Param(
        float,
        5.0,
        "fire when a channel's std is above this or the pooled std below its inverse",
        check=lambda value: None if value > 1 else "must be > 1",
    )
    threshold_samples = Param(
        int, 100, "samples to accumulate before judging", check=lambda value: None if value >= 1 else "must be >= 1"
    )
    channel = Param(int, None, "axis of the channels/features (default: 1, or the last axis of 3-D inputs)")

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._stats: dict[str, ChannelStats] = {}
        self._seen: set[int] = set()  # a step is counted once, however often it is evaluated
        # per tensor: which channels held only 0 and 1 so far, and which held a 1
        self._binary: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._inputs_anywhere: bool | None = None
        # per tensor: (the one value its latest batches all held, how many samples in a row held it)
        self._constant: dict[str, tuple[float, int]] = {}
        self._unit_rows: dict[str, bool] = {}  # per tensor: every sample so far a normalised row

    def validate(self) -> None:
        check_regexes(self, "tensor_regex")

    def _names(self, step: int) -> list[str]:
        if self.collection_names or self.tensor_regex:
            return select(self, step, collections=self.collection_names, regex=self.tensor_regex)
        return data_inputs(self.base_trial, step)

    def _forget_derived(self) -> None:
        """Drop what was read of inputs the hook has since found not to be data (a state fed back
        is found at the step after the first saved one, when that step's inputs were read)."""
        for name in derived_inputs(self.base_trial) & set(self._stats):
            for kept in (self._stats, self._binary, self._constant, self._unit_rows):
                kept.pop(name, None)

    def accumulate(self, step: int) -> list[str] | None:
        """Add this step's batches; the names read, or None when the step is not ready."""
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        names = self._names(step)
        if not (self.collection_names or self.tensor_regex):
            self._forget_derived()
        if step in self._seen:
            return names
        self._seen.add(step)
        values = read_values(trial, names, step)
        relations = _relations(values)
        for name, value in values.items():
            array = np.asarray(value)
            if array.dtype.kind not in "f" or array.ndim == 0 or name in relations:
                continue
            axis = channel_axis(array, self.channel)
            if not 0 <= axis < array.ndim:
                continue
            self._track_constant(name, array, axis)
            if self._stats.setdefault(name, ChannelStats()).add(array.astype(np.float64), axis):
                moved = np.moveaxis(array, axis, -1).reshape(-1, array.shape[axis])
                self._unit_rows[name] = self._unit_rows.get(name, True) and _normalised_rows(moved)
                binary = np.all((moved == 0) | (moved == 1), axis=0)
                ones = np.any(moved == 1, axis=0)
                seen = self._binary.get(name)
                if seen is None or seen[0].shape != binary.shape:
                    self._binary[name] = (binary, ones)
                else:
                    self._binary[name] = (seen[0] & binary, seen[1] | ones)
        return names

    def _track_constant(self, name: str, array: np.ndarray, axis: int) -> None:
        samples = array.shape[0] if axis != 0 else 1
        if array.size == 0:
            return
        first = float(array.flat[0])
        if not np.isfinite(first) or not np.all(array == first):
            self._constant.pop(name, None)
            return
        value, run = self._constant.get(name, (first, 0))
        self._constant[name] = (first, run + samples if value == first else samples)

    def _constant_issue(self, step: int) -> StepResult | None:
        for name, (value, run) in sorted(self._constant.items()):
            if run >= self.threshold_samples:
                return self.issue(
                    step,
                    f"input {name}: every value of the last {run} samples is {fmt(value)}: the inputs carry no "
                    "information (check the data pipeline)",
                    tensor=name, constant=value, samples=run,
                )
        return None

    @staticmethod
    def _pooled_std(stats: ChannelStats, channels: np.ndarray) -> float:
        """σ of all values of the selected channels (as ChannelStats.pooled_std for all of them)."""
        assert stats.count is not None and stats.total is not None and stats.squares is not None
        n = max(float(stats.count[channels].sum()), 1.0)
        mean = float(stats.total[channels].sum()) / n
        return float(np.sqrt(max(float(stats.squares[channels].sum()) / n - mean * mean, 0.0)))

    def check(self, step: int) -> StepResult | None:
        names = self.accumulate(step)
        if names is None:
            return None
        if not self._stats:
            if not names and self.base_trial.training_ended and not self._names_anywhere():
                return self.missing(step, MissingTensor("model inputs", "model_inputs"))
            return None
        constant = self._constant_issue(step)
        if constant is not None:
            return constant
        judged = {name: stats for name, stats in self._stats.items() if stats.samples >= self.threshold_samples}
        # Before threshold_samples, a tensor is judged only on significant evidence: each bound must
        # hold with EARLY_Z standard errors to spare (so raw pixels or features in the thousands are
        # reported from the first batches, a borderline mean waits for the full sample).
        early = {
            name: stats
            for name, stats in self._stats.items()
            # inputs that are one constant so far are the constant check's (its own sample count)
            if name not in judged and stats.samples >= EARLY_MIN_SAMPLES and name not in self._constant
        }
        if not judged and not early:
            return None
        for name, stats in sorted({**judged, **early}.items()):
            z = 0.0 if name in judged else EARLY_Z
            root = np.sqrt(max(stats.samples, 1))
            # indicator features: 0/1 channels of a tensor where some channel does take the value 1
            # (a rare feature may not have fired yet); all-zero inputs everywhere are no indicators
            binary, ones = self._binary.get(name, (np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)))
            continuous = ~(binary & bool(np.any(binary & ones)))
            if continuous.size and not continuous.any():
                continue  # every feature is a 0/1 indicator
            means, stds = stats.means(), stats.stds()
            if continuous.size == means.size:
                means, stds = np.where(continuous, means, 0.0), np.where(continuous, stds, 1.0)
                pooled = self._pooled_std(stats, continuous)
            else:
                pooled = stats.pooled_std()
            details = dict(
                tensor=name,
                samples=stats.samples,
                means=means.tolist()[:64],
                stds=stds.tolist()[:64],
                pooled_std=pooled,
            )
            # standard errors from the sample (row) count: values within a sample are correlated
            mean_margin = z * stds / root
            std_factor = max(1.0 - z / np.sqrt(2.0) / root, 0.0)
            worst_mean = int(np.argmax(np.abs(means) - mean_margin))
            worst_std = int(np.argmax(stds))
            if abs(means[worst_mean]) - mean_margin[worst_mean] > self.threshold_mean:
                return self.issue(
                    step,
                    f"input {name}: channel {worst_mean} has mean {fmt(means[worst_mean])} "
                    f"(|mean| > threshold_mean {fmt(self.threshold_mean)}) over {stats.samples} samples",
                    channel=worst_mean,
                    **details,
                )
            if stds[worst_std] * std_factor > self.threshold_std:
                return self.issue(
                    step,
                    f"input {name}: channel {worst_std} has std {fmt(stds[worst_std])} "
                    f"(> threshold_std {fmt(self.threshold_std)}) over {stats.samples} samples",
                    channel=worst_std,
                    **details,
                )
            if self._unit_rows.get(name, False):
                continue  # row-normalised: small values by construction (module docstring)
            if pooled * (1.0 + z / np.sqrt(2.0) / root) < 1.0 / self.threshold_std:
                return self.issue(
                    step,
                    f"input {name}: std of all values is {fmt(pooled)} "
                    f"(< 1/threshold_std = {fmt(1.0 / self.threshold_std)}) over {stats.samples} samples",
                    channel=None,
                    **details,
                )
        if not judged:
            return None  # only early looks so far, none significant: wait for threshold_samples
        return self.no_issue(step, tensors=sorted(judged))

    def _names_anywhere(self) -> bool:
        """Whether the run's last step has model inputs; asked only once training ended (nothing new
        can come), so it is answered once, not at every step (no O(steps) listing per step)."""
        if self._inputs_anywhere is None:
            trial = self.base_trial
            last = trial.last_complete_step() if callable(getattr(trial, "last_complete_step", None)) else None
            if last is None:
                steps = trial.steps()
                last = steps[-1] if steps else None
            self._inputs_anywhere = last is not None and bool(self._names(last))
        return self._inputs_anywhere


def _normalised_rows(rows: np.ndarray) -> bool:
    """Whether every row (one sample's features) is all zero, or non-negative summing to 1, or of
    unit L2 norm (rows with a non-finite value are not)."""
    if rows.shape[1] < 2 or not np.all(np.isfinite(rows)):
        return False
    values = rows.astype(np.float64)
    l1 = np.abs(values).sum(axis=1)
    l2 = np.sqrt((values * values).sum(axis=1))
    zero = l1 == 0
    distribution = (values.min(axis=1) >= 0) & (np.abs(l1 - 1.0) <= UNIT_ROW_TOLERANCE)
    unit = np.abs(l2 - 1.0) <= UNIT_ROW_TOLERANCE
    return bool(np.all(zero | distribution | unit)) and not bool(np.all(zero))


def _relations(values: dict[str, np.ndarray]) -> set[str]:
    """Names of N×N inputs saved with another input of N samples (rows): relations between the
    samples (an adjacency), not features of them."""
    arrays = {name: np.asarray(value) for name, value in values.items()}
    found = set()
    for name, array in arrays.items():
        if array.ndim == 2 and array.shape[0] == array.shape[1] and array.shape[0] > 1:
            others = (other for key, other in arrays.items() if key != name and other.ndim >= 1)
            if any(other.shape[0] == array.shape[0] and other.shape != array.shape for other in others):
                found.add(name)
    return found
