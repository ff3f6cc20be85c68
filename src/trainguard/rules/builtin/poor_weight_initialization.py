"""PoorWeightInitialization: only at training steps with mode step ≤ ``steps``, fire if

* ``max_l Var(x_l) / min_l Var(x_l) > threshold`` over the activation inputs x_l (one tensor per
  layer, ≥ 2 layers), or
* ``min_g (p95(g) − p5(g)) < distribution_range`` over the gradient tensors g, or
* (trainguard, calibrated semantics) a tanh/sigmoid layer starts saturated: more than
  ``saturation_share`` (50 %) of its inputs lie where the activation's derivative is below
  ``saturation_derivative`` (1 %) of its maximum (|x| > 2.99 for tanh, 5.99 for sigmoid) — weights
  too large for the activation (N(0, 3²) puts 75-90 % there, Xavier 0 %) or inputs far from unit
  scale; SaturatedActivation's per-node test misses it, since every node of such a layer still
  crosses the linear region in a few per cent of the samples. Advice (the run may learn, slowly);
  a learning symptom makes it a candidate cause. A layer that saturates during training (a
  confident output sigmoid) is not a sign: it must hold at the first evaluated step; or
* the training loss is stuck: its last ``patience`` saved values differ by less than
  ``loss_tolerance`` (trainguard, 0.1 %) of their mean — what a model whose output does not
  depend on its input (zero/constant init, every unit identical) produces.

SageMaker ``rule_to_invoke``: ``PoorWeightInitialization``; parameters
``activation_inputs_regex`` (``".*relu_input"``), ``threshold`` (10.0), ``distribution_range``
(0.001), ``patience`` (5), ``steps`` (10). Tensors: ``relu_input`` collection (the PyTorch hook's
``nn.ReLU`` inputs) ∪ ``activation_inputs_regex``; ``tanh_input``/``sigmoid_input``; ``gradients``;
``losses``.

Calibration (documented defaults fire on healthy PyTorch runs, rules.md "Measured"):

* ``distribution_range`` 1e-8 instead of 0.001: a healthy gradient's 5–95 % spread scales with the
  loss and the layer (5–8·10⁻⁴ in the suite's healthy 5-layer MLPs; a one-element bias
  gradient's spread is always 0); what poor initialisation produces is a spread of (nearly)
  zero: ≤ 10⁻⁹ in every zero/constant-init and saturated run of the suite. Gradients with
  fewer than ``min_gradient_size`` (trainguard, 16) elements are not judged.
* ``threshold`` 1000 instead of 10: PyTorch's default init (kaiming_uniform with a=√5) shrinks
  the ReLU-input variance about 6× per layer; a healthy 5-hidden-layer MLP of the fault suite
  differs 60–125× at step 0 (docs/rules-calibration.md). Zero init (variance 0 → ratio ∞) and
  large init or a too-high learning rate (≥ 10⁵ in the suite) stay far above 1000.
* the loss condition is "stuck" instead of SageMaker's "no longer decreasing": a healthy
  mini-batch loss routinely goes 5 saved steps without a new minimum, and a healthy CNN's
  loss often does not decrease at all in its first 10 SGD steps; both fired on healthy runs.

Calibrated semantics (default) also require the condition at ``confirm_steps`` (2) consecutive
evaluated training steps (the first of them within ``steps``; the confirming one may come
later when the hook saves rarely), and do not judge gradients that are narrow by construction:
attention key biases (softmax is shift invariant: dL/d(b_key) = 0 up to rounding), all-zero
gradient tensors (no signal reached them in that batch: frozen, unused or fed all-zero inputs;
zero init is caught by the activation-variance condition), weight gradients of a layer fed
all-zero inputs, and the exactly-zero elements of a gradient (embedding rows of tokens or
positions absent from the batch: the spread is taken over the non-zero elements). A narrow
gradient counts only when its spread is also below ``IDENTICAL_UNITS`` (0.1 %) of its largest
value (identical units, not a vanished gradient), and the variance and gradient conditions count
only when they already hold at the first evaluated training step (poor initialisation shows at
initialisation; a learning rate that blows up the activations later is not one).
``semantics="sagemaker"`` judges every analysed step on its own.

Several models (a GAN's generator and discriminator, an actor and a critic: the hook's
``model_scopes``): the variance ratio is taken within each model, never across two (their
inputs and scales are unrelated). Calibrated semantics skip the ratio for a model with a
normalisation layer (a 1-D weight: BatchNorm/LayerNorm/GroupNorm scale): what follows one has the
normalisation's variance, not the initialisation's, so a ratio across its layers measures
nothing (a DCGAN's N(0, 0.02) init puts 2,000× between its first layer and a batch-normalised
one, and trains well). Zero variance is still judged there. The rule cannot tell a badly
initialised layer before a normalisation layer from a healthy small one: it says nothing then.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from trainguard.modes import ModeKeys
from trainguard.rules.base import MissingTensor, StepResult
from trainguard.rules.builtin._helpers import (
    all_finite,
    as_float,
    check_regexes,
    fmt,
    is_complete,
    read_values,
    select,
    training_mode,
)
from trainguard.rules.builtin._parallel import map_tensors
from trainguard.rules.builtin._persistence import TensorRule, is_key_bias, zero_input_weight
from trainguard.rules.builtin.saturated_activation import activation_kind, flat_bound
from trainguard.rules.params import SAGEMAKER, Param, semantics_param

# calibrated: a gradient's units are identical when its 5-95 % spread is below this share of its
# largest magnitude (float rounding of identical values; a vanished gradient's spread is ~its size)
IDENTICAL_UNITS = 1e-3

_PERCENTS = np.true_divide(np.array([5, 95]), 100)  # as np.percentile turns [5, 95] into quantiles


def _spread(array: np.ndarray) -> float:
    """``p95 - p5`` exactly as ``np.percentile(array.astype(np.float64), [5, 95])`` gives them, for
    a finite real float array of at least 2 elements.

    Widening to float64 keeps the order, so the order statistics np.percentile interpolates
    between can be selected in the array's own precision (half the memory traffic of float32
    → float64 first) and only they are widened. The interpolation is numpy's "linear" method,
    step for step: virtual index (n − 1)·q, gamma = its fraction, ``a + (b − a)·γ`` or, for
    γ ≥ 0.5, ``b − (b − a)·(1 − γ)``.
    """
    flat = array.ravel()
    n = flat.size
    virtual = (n - 1) * _PERCENTS
    below = np.floor(virtual)
    gamma = virtual - below
    low = below.astype(np.intp)
    # Select each lower neighbour with its own single-index partition (numpy's SIMD selection;
    # a two-index partition falls back to a far slower generic one): first the larger on the
    # whole array, then the smaller within the part below it. Each upper neighbour (index + 1)
    # is then the smallest value of the slice after its lower one.
    k5, k95 = low.tolist()
    ordered = np.partition(flat, k95)
    if k5 < k95:
        ordered[:k95].partition(k5)
    results = []
    for k, g, stop in ((k5, gamma[0], k95 + 1 if k5 < k95 else n), (k95, gamma[1], n)):
        a = np.float64(ordered[k])
        b = np.float64(ordered[k + 1 : stop].min()) if k + 1 < n else a
        diff = b - a
        results.append(b - diff * (1 - g) if g >= 0.5 else a + diff * g)
    return float(results[1] - results[0])


def module_head(name: str) -> str:
    """The first component of a module tensor's name: ``main`` of ``main.2_input_0``, ``fc1`` of
    ``fc1_input_0``."""
    return re.sub(r"_(input|output)_\d+$", "", name).split(".", 1)[0]


def model_heads(trial: Any) -> dict[str, str]:
    """First name component -> the model it belongs to, for runs that trained several models
    (the hook's ``model_scopes``; empty for one model, Keras and smdebug runs)."""
    scopes = getattr(trial, "model_scopes", None) or {}
    return {head: model for model, heads in scopes.items() for head in heads}


def _normalised_models(values: dict[str, Any], heads: dict[str, str]) -> set[str | None]:
    """The models (as :func:`model_heads` groups them) with a normalisation layer: a 1-D weight
    gradient is a BatchNorm/LayerNorm/GroupNorm scale."""
    models = set(heads.values())
    found: set[str | None] = set()
    for name, value in values.items():
        # PyTorch's gradient/<model>_<parameter>, Keras's gradients/<layer>/gamma
        if not (name.startswith(("gradient/", "gradients/")) and name.endswith(("weight", "gamma"))):
            continue
        if np.ndim(value) != 1:
            continue
        stem = name.split("/", 1)[1]
        owners = [model for model in models if stem.startswith(f"{model}_")]
        found.add(max(owners, key=len) if owners else None)
    return found


def _ratio(variances: dict[str, float]) -> tuple[float, str, str]:
    """(max/min variance, the highest layer, the lowest): infinite when the lowest is zero."""
    high = max(variances, key=lambda key: variances[key])
    low = min(variances, key=lambda key: variances[key])
    return (variances[high] / variances[low] if variances[low] > 0 else float("inf")), high, low


class PoorWeightInitialization(TensorRule):
    """Signs of a bad initialisation in the first training steps."""

    rule_name = "PoorWeightInitialization"
    collections = ("relu_input", "tanh_input", "sigmoid_input", "gradients", "losses")
    needs = "no ReLU/tanh/sigmoid inputs, gradients or losses were saved in the first training steps"
    stop_policy = (
        "stops training when zero variance or identical units (infinite variance ratio, zero gradient "
        "spread) are confirmed at confirm_steps consecutive steps; other findings and SageMaker semantics "
        "never stop"
    )
    fix_hint = "use the layer's default or Xavier/He initialisation; never constant or zero weights"
    fix_hints = {
        "pytorch": (
            "use the layer's default or Xavier/He initialisation (torch.nn.init.kaiming_normal_ for ReLU, "
            "xavier_uniform_ for tanh/sigmoid); never constant or zero weights"
        ),
        "keras": (
            "use kernel_initializer='he_normal' for ReLU layers and 'glorot_uniform' for tanh/sigmoid; "
            "never 'zeros' or 'ones' kernels"
        ),
    }

    activation_inputs_regex = Param(list, [".*relu_input"], "regexes of activation input names", optional=True)
    threshold = Param(
        float,
        1000.0,
        "fire when max/min activation-input variance across layers is above this",
        documented_default=10.0,
    )
    distribution_range = Param(float, 1e-8, "fire when a gradient's p95 - p5 is below this", documented_default=0.001)
    patience = Param(
        int,
        5,
        "saved loss values that must all be (nearly) equal to fire",
        check=lambda value: None if value >= 1 else "must be >= 1",
    )
    steps = Param(
        int,
        10,
        "how many initial training steps are analysed",
        check=lambda value: None if value >= 1 else "must be >= 1",
    )
    loss_tolerance = Param(float, 1e-3, "relative spread below which the loss counts as stuck (trainguard)")
    min_gradient_size = Param(int, 16, "gradients with fewer elements are not judged (trainguard)")
    saturation_derivative = Param(
        float,
        0.01,
        "calibrated: a tanh/sigmoid input is in the flat region where the derivative is below this share of its "
        "maximum (trainguard)",
        check=lambda value: None if 0 < value < 1 else "must be between 0 and 1",
    )
    saturation_share = Param(
        float,
        0.5,
        "calibrated: fire when more than this share of a tanh/sigmoid layer's inputs is in the flat region at "
        "initialisation (trainguard)",
        check=lambda value: None if 0 < value < 1 else "must be between 0 and 1",
    )
    semantics = semantics_param()
    confirm_steps = Param(
        int,
        2,
        "calibrated: consecutive evaluated training steps the condition must hold at (trainguard)",
        check=lambda value: None if value >= 1 else "must be >= 1",
    )

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._losses: dict[int, float] = {}
        self._streak = 0  # consecutive evaluated steps with a condition met (calibrated)
        self._initial: bool | None = None  # calibrated: did the first evaluated step show a variance/gradient sign

    def validate(self) -> None:
        check_regexes(self, "activation_inputs_regex")

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        mode = training_mode(trial)
        if mode != ModeKeys.GLOBAL and trial.mode(step) != mode:
            return None
        calibrated = self.semantics != SAGEMAKER
        needed = self.confirm_steps if calibrated else 1
        if trial.mode_step(step) > self.steps and not (calibrated and 0 < self._streak < needed):
            return None
        activations = select(self, step, collections=["relu_input"], regex=self.activation_inputs_regex)
        squashing = select(self, step, collections=["tanh_input", "sigmoid_input"]) if calibrated else []
        gradients = select(self, step, collections=["gradients"])
        losses = select(self, step, collections=["losses"])
        if not (activations or squashing or gradients or losses):
            if trial.training_ended and step == trial.steps()[0]:
                return self.missing(step, MissingTensor("ReLU inputs, gradients or losses", "relu_input"))
            return None
        values = read_values(trial, list(dict.fromkeys(activations + squashing + gradients + losses)), step)
        details: dict[str, Any] = {}
        # every condition runs every step: the loss history must not skip steps where another fired
        found = [
            self._variance(step, activations, values, details),
            self._gradients(step, gradients, values, details),
            self._saturation(squashing, values, details),
            self._loss(step, losses, values, details),
        ]
        if calibrated:
            # poor initialisation shows at initialisation: when the first evaluated training step had
            # no variance, gradient or saturation sign, later ones are training's doing (a learning rate
            # that blows the activations up, ReLUs that die, a confident sigmoid output): ExplodingTensor's,
            # DeadRelu's findings
            if self._initial is None:
                self._initial = bool(found[0] or found[1] or found[2])
            if not self._initial:
                found = [None, None, None, found[3]]
        problem = next((text for text in found if text), None)
        self._streak = self._streak + 1 if problem else 0
        if problem and self._streak >= needed:
            if calibrated:
                problem += f" (at {self._streak} consecutive evaluated steps)"
            identical = details.get("variance_ratio") == float("inf") or details.get("min_gradient_spread") == 0.0
            return self.issue(step, problem, certain=calibrated and identical, **details)
        return self.no_issue(step, **details)

    def _variance(self, step: int, names: list[str], values: dict, details: dict) -> str | None:
        variances: dict[str, float] = {}
        for name in names:
            array = as_float(values.get(name)) if name in values else None
            if array is None or array.size < 2:
                continue
            raw = np.asarray(values[name])
            if raw.dtype.kind == "f":
                finite = all_finite(self.base_trial, step, name, raw)  # shared with the other rules
            else:
                finite = bool(np.all(np.isfinite(array)))
            if finite:
                variances[name] = float(np.var(array))
        # the layers of one model are compared, never a generator's with a discriminator's
        models: dict[str | None, dict[str, float]] = {}
        scopes = model_heads(self.base_trial)
        for name, variance in variances.items():
            models.setdefault(scopes.get(module_head(name)), {})[name] = variance
        judged = [(_ratio(group), model, group) for model, group in models.items() if len(group) >= 2]
        if not judged:
            return None
        (ratio, high, low), model, variances = max(judged, key=lambda item: item[0][0])
        details.update(variance_ratio=ratio, variances=variances)
        if len(models) > 1 and model is not None:
            details.update(model=model)
        normalised = self.semantics != SAGEMAKER and model in _normalised_models(values, scopes)
        if normalised:
            details.update(normalised=True)
        if variances[low] == 0:
            return (
                f"activation input {low} has zero variance (every unit computes the same value) while "
                f"{high}'s is {fmt(variances[high])}: the weights do not break symmetry"
                if variances[high] > 0
                else f"every activation input has zero variance ({len(variances)} layers): the weights do not "
                "break symmetry"
            )
        if ratio > self.threshold and not normalised:
            return (
                f"activation-input variance differs {fmt(ratio)}× across layers ({high}: {fmt(variances[high])}, "
                f"{low}: {fmt(variances[low])}); threshold {fmt(self.threshold)}"
            )
        return None

    def _saturation(self, names: list[str], values: dict, details: dict) -> str | None:
        """Most of a tanh/sigmoid layer's inputs where the activation is flat: initial weights too
        large for it (or unscaled inputs). SaturatedActivation's per-node test misses this: with
        pre-activations of std 10-25, every node still crosses the linear region in some samples."""
        worst: tuple[float, str, str, float] | None = None
        for name in names:
            array = as_float(values.get(name)) if name in values else None
            if array is None or array.size < 2:
                continue
            kind = activation_kind(self.base_trial, name)
            bound = flat_bound(kind, self.saturation_derivative)
            with np.errstate(invalid="ignore"):
                share = float(np.mean(np.abs(array) > bound))  # NaN is not saturation: ExplodingTensor's
            if worst is None or share > worst[0]:
                worst = (share, name, kind, bound)
        if worst is None:
            return None
        share, name, kind, bound = worst
        details.update(saturated_share=share, saturated_tensor=name)
        if share > self.saturation_share:
            return (
                f"{fmt(100 * share)}% of {kind} input {name} lies where {kind} is flat (|x| > {fmt(bound)}: "
                f"derivative below {fmt(100 * self.saturation_derivative)}% of its maximum) from the start; "
                f"saturation_share {fmt(100 * self.saturation_share)}%: the initial weights are too large for {kind}"
            )
        return None

    def _gradients(self, step: int, names: list[str], values: dict, details: dict) -> str | None:
        calibrated = self.semantics != SAGEMAKER

        def spread(name: str, value: np.ndarray) -> float | None:
            raw = np.asarray(value)
            if calibrated and raw.size and not np.all(raw):
                # exact zeros are structural (embedding rows of tokens absent from the batch, unused
                # positions, inputs that were zero): the spread of the units that got a signal counts
                raw = raw[raw != 0]
            if raw.dtype.kind == "f":  # real floats: select in their own precision (see _spread)
                if raw.size < max(self.min_gradient_size, 2) or not all_finite(self.base_trial, step, name, raw):
                    return None
                return _spread(raw)
            array = as_float(raw)
            if array is None or array.size < max(self.min_gradient_size, 2) or not np.all(np.isfinite(array)):
                return None
            p5, p95 = np.percentile(array, [5, 95])
            return float(p95 - p5)

        judged = {name: values[name] for name in names if name in values}
        if calibrated:
            # narrow by construction: key biases, all-zero gradients, weights fed all-zero inputs
            judged = {
                name: value
                for name, value in judged.items()
                if not is_key_bias(name)
                and np.any(np.asarray(value))
                and not zero_input_weight(name, np.asarray(value), values)
            }
        found = map_tensors(spread, judged)  # two cores
        spreads = {name: value for name, value in found.items() if value is not None}
        if calibrated:
            # identical units give a spread that is ~0 next to the gradient's own size; a vanished
            # gradient (deep sigmoid stack) is tiny but spread like its values: VanishingGradient's
            for name in [name for name, value in spreads.items() if value < self.distribution_range]:
                magnitude = float(np.max(np.abs(np.asarray(judged[name], dtype=np.float64))))
                if spreads[name] > IDENTICAL_UNITS * magnitude:
                    del spreads[name]
        if not spreads:
            return None
        narrowest = min(spreads, key=lambda key: spreads[key])
        details.update(min_gradient_spread=spreads[narrowest], gradient=narrowest)
        if spreads[narrowest] < self.distribution_range:
            return (
                f"gradient {narrowest} has a 5th-95th percentile spread of {fmt(spreads[narrowest])} "
                f"< distribution_range {fmt(self.distribution_range)} (units receive identical updates)"
            )
        return None

    def _loss(self, step: int, names: list[str], values: dict, details: dict) -> str | None:
        losses = [float(np.mean(values[name])) for name in names if name in values and np.size(values[name])]
        if not losses:
            return None
        loss = float(np.mean(losses))
        if not np.isfinite(loss):
            return None
        self._losses[step] = loss
        history = [self._losses[key] for key in sorted(self._losses)][-self.patience :]
        if len(history) < self.patience:
            return None
        spread = (max(history) - min(history)) / max(abs(float(np.mean(history))), 1e-12)
        details.update(loss=loss, loss_spread=spread)
        if spread < self.loss_tolerance:
            return (
                f"the loss is stuck at {fmt(loss)}: its last {self.patience} saved values differ by "
                f"{fmt(100 * spread)}% < loss_tolerance {fmt(100 * self.loss_tolerance)}% "
                "(the output ignores the input)"
            )
        return None
