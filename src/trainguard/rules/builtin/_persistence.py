"""What the calibrated tensor-state rules share: persistence windows and zero-by-construction gradients.

A tensor-state condition (a vanished gradient, an all-zero tensor, a dead layer) seen at one saved
step is as often a property of that one batch (a batch-size-1 run whose input row is all zeros,
a mini-batch where most ReLUs happen to be off) as a fault. Under calibrated semantics such a
rule fires only when its condition held at most of the last ``window`` evaluated steps, and its
finding is certain (may stop training) only when the condition held at every step of a full
window. Non-finite values are the exception: they never heal, so they are immediate and certain.

``semantics="sagemaker"`` gives SageMaker's documented single-step conditions back.

Some gradients are zero by construction, and no rule may call them vanished, dead or unchanged:

* attention key biases: softmax is shift invariant, so dL/d(b_key) = 0 (up to float rounding);
* frozen parameters: no gradient is saved at all (``requires_grad=False``);
* weights fed by inputs that are all zero in a batch: dL/dW = δ·xᵀ = 0 while the same layer's
  bias gradient δ is not zero;
* biases that cancel out of the loss: dL/db = Σδ = 0 exactly while the same layer's weight
  gradient δ·xᵀ is not zero (a siamese net's shared embedding bias under |f(x₁) − f(x₂)|: the
  two passes' δ are equal and opposite). A dead or saturated layer has δ = 0, so its weight
  gradient is zero too and it is still judged;
* embedding rows of tokens absent from a batch: exactly-zero elements inside a gradient that is
  otherwise non-zero (rules average over the non-zero elements).
"""

from __future__ import annotations

import dataclasses
import re
from collections import deque
from collections.abc import Hashable, Mapping
from typing import Any, ClassVar

import numpy as np

from trainguard.rules.base import Rule, StepResult
from trainguard.rules.params import CALIBRATED, SAGEMAKER, Param, semantics_param

__all__ = [
    "KEY_BIAS",
    "Persistence",
    "PersistentRule",
    "TensorRule",
    "bias_partner",
    "cancelled_bias",
    "is_key_bias",
    "zero_input_weight",
]

# Attention key biases, by the names PyTorch/Hugging Face/Keras models give them: BERT's
# ``attention.self.key.bias``, GPT-style ``k_proj.bias``, T5/Keras ``key/bias``.
KEY_BIAS = re.compile(r"(^|[._/])(key|k_proj|k_lin|keys|to_k|wk)[._/]bias(:\d+)?$", re.IGNORECASE)


def is_key_bias(name: str) -> bool:
    """Whether ``name`` (a parameter or its ``gradient/`` tensor) is an attention key bias."""
    return bool(KEY_BIAS.search(name.removeprefix("gradient/")))


def bias_partner(name: str) -> str | None:
    """The bias of the layer a weight (or weight gradient) ``name`` belongs to, or None."""
    for suffix, bias in ((".weight", ".bias"), ("/kernel", "/bias"), ("_weight", "_bias")):
        stem, found, tail = name.rpartition(suffix)
        if found and (not tail or re.fullmatch(r":\d+", tail)):
            return stem + bias + tail
    return None


def weight_partner(name: str) -> str | None:
    """The weight of the layer a bias (or bias gradient) ``name`` belongs to, or None."""
    for suffix, weight in ((".bias", ".weight"), ("/bias", "/kernel"), ("_bias", "_weight")):
        stem, found, tail = name.rpartition(suffix)
        if found and (not tail or re.fullmatch(r":\d+", tail)):
            return stem + weight + tail
    return None


def cancelled_bias(name: str, array: np.ndarray, values: Mapping[str, Any]) -> bool:
    """A bias gradient that is exactly zero while its layer's weight gradient is not: the bias
    cancels out of the loss (Σδ = 0 with δ ≠ 0), by construction, not a vanished or dead gradient."""
    partner = weight_partner(name)
    if partner is None or partner not in values or np.any(array):
        return False
    weight = np.asarray(values[partner])
    return weight.dtype.kind in "fc" and bool(np.any(weight))


def zero_input_weight(name: str, array: np.ndarray, values: Mapping[str, Any]) -> bool:
    """A weight gradient that is exactly zero while its layer's bias gradient is not: the inputs of
    that layer were zero in this batch (dL/dW = δ·xᵀ), not a vanished or dead gradient."""
    partner = bias_partner(name)
    if partner is None or partner not in values or np.any(array):
        return False
    bias = np.asarray(values[partner])
    return bias.dtype.kind in "fc" and bool(np.any(bias))


class Persistence:
    """Whether a condition held at each of the last ``window`` evaluated steps, per key.

    O(1) per update: one bounded deque per key (never a rescan of the run's history).
    """

    def __init__(self, window: int, needed: int | None = None) -> None:
        self.window = max(1, int(window))
        # "most of the window": a strict majority (1 of 1, 2 of 2 or 3, 3 of 4 or 5, ...)
        self.needed = needed if needed is not None else self.window // 2 + 1
        self._held: dict[Hashable, deque[bool]] = {}

    def update(self, key: Hashable, held: bool) -> None:
        history = self._held.get(key)
        if history is None:
            history = self._held[key] = deque(maxlen=self.window)
        history.append(bool(held))

    def count(self, key: Hashable) -> int:
        return sum(self._held.get(key, ()))

    def persistent(self, key: Hashable, needed: int | None = None) -> bool:
        """Held now and at most of the window (or at ``needed`` of its steps)."""
        history = self._held.get(key)
        if not history:
            return False
        return history[-1] and sum(history) >= min(self.window, needed or self.needed)

    def confirmed(self, key: Hashable) -> bool:
        """Held at every step of a full window."""
        history = self._held.get(key)
        return history is not None and len(history) == self.window and all(history)

    def forget(self, key: Hashable) -> None:
        self._held.pop(key, None)


class TensorRule(Rule):
    """Bookkeeping every tensor rule shares: "not evaluated" when it never judged a step (``needs``
    says what data is missing), and the worker of a trial view bound to one worker."""

    needs: ClassVar[str] = "the tensors this rule reads were never saved"
    reads_only_collections = True  # see Rule.inapplicable

    def __init__(self, *args: Any, **parameters: Any) -> None:
        super().__init__(*args, **parameters)
        self._evaluated_steps = 0

    def evaluate(self, step: int) -> StepResult | None:
        result = super().evaluate(step)
        if result is None:
            return None
        if result.evaluated:
            self._evaluated_steps += 1
        worker = getattr(self.base_trial, "bound_worker", None)
        if isinstance(worker, str) and result.worker is None:
            # a trial view bound to one worker (trainguard.trial.worker_view: the runner evaluates
            # every worker with its own rule instance)
            result = dataclasses.replace(result, worker=worker)
        return result

    def finish(self) -> StepResult | None:
        if self._evaluated_steps == 0:
            return self.not_evaluated(self.needs)
        return None


class PersistentRule(TensorRule):
    """A tensor-state rule with calibrated (windowed) and SageMaker (single-step) semantics.

    Subclasses judge one step's condition and call :meth:`persisted`; they set
    ``needs`` (what data the rule reads, for "RuleNotEvaluated") and may override
    ``sagemaker_overrides`` ({parameter: SageMaker's documented default}) for parameters whose
    calibrated default differs: those documented values apply under ``semantics="sagemaker"``
    unless the configuration gives the parameter explicitly.
    """

    sagemaker_overrides: ClassVar[Mapping[str, Any]] = {}

    semantics = semantics_param()
    window = Param(
        int,
        5,
        "calibrated: a condition must hold at most of this many consecutive evaluated steps (trainguard)",
        check=lambda value: None if value >= 1 else "must be >= 1",
    )

    def __init__(self, *args: Any, **parameters: Any) -> None:
        super().__init__(*args, **parameters)
        if self.semantics == SAGEMAKER:
            for key, value in self.sagemaker_overrides.items():
                if key not in parameters:
                    self.__dict__[key] = value
        self.persistence = Persistence(1 if self.single_step else self.window)

    @property
    def single_step(self) -> bool:
        return self.semantics == SAGEMAKER

    @property
    def calibrated(self) -> bool:
        return self.semantics == CALIBRATED

    def persisted(self, key: Hashable, held: bool, needed: int | None = None) -> tuple[bool, bool]:
        """Record this step's condition for ``key``; (fire, certain). ``needed`` lowers the count of
        steps that must hold for a condition whose single observation is already far outside what
        healthy training shows (certainty still needs the full window)."""
        self.persistence.update(key, held)
        if not held:
            return False, False
        if self.single_step:
            return True, False
        return self.persistence.persistent(key, needed), self.persistence.confirmed(key)

    def persistence_text(self, key: Hashable) -> str:
        if self.single_step:
            return "at this step"
        return f"at {self.persistence.count(key)} of the last {self.persistence.window} evaluated steps"
