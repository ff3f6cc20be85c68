"""ProbabilitiesIntoCrossEntropy: a cross-entropy loss is given probabilities instead of logits.

``CrossEntropyLoss`` (and ``F.cross_entropy``) applies ``log_softmax`` to its input 0 itself. A
model that ends in ``Softmax`` hands it probabilities: the loss then takes the softmax of values
in [0, 1], its gradients are bounded by that second softmax's small Jacobian, and the loss creeps
down from near log(C) at best (the detection corpus' softmax-before-CE MLP, 1.38 -> 1.18 in 80
steps, while its healthy twin reaches 0.1). No other rule can say *why*: LossNotDecreasing sees a
slow loss, VanishingGradient small gradients.

Formula: at a saved step, the predictions tensor of a cross-entropy loss (``<...CrossEntropy...>_input_0``
or ``<...cross_entropy...>_input_0`` in collection ``predictions``) with a class axis (axis 1) of
C >= 2 classes fires when every value is in [0, 1] and every row sums to 1 within ``tolerance``.
Raw logits of a trained or untrained model do not do that (they are signed and unnormalised);
this is a fact of the run's configuration, so it is reported at the first saved step where it
holds. ``NLLLoss`` is meant for log-probabilities and is not judged; log-probabilities
(``LogSoftmax`` before ``CrossEntropyLoss``) are harmless (log_softmax of log_softmax is the same
distribution) and are not flagged.

Not covered: an MSE loss regressing class indices (one output column against integer targets)
is not visible here: the capture keeps a regression loss's inputs out of ``predictions``/``labels``,
and integer targets of a regression (counts, ratings) cannot be told from class indices anyway.
"""

from __future__ import annotations

import re

import numpy as np

from trainguard.rules.base import Rule, StepResult
from trainguard.rules.builtin._losses import fmt, is_complete, read_values
from trainguard.rules.params import Param

# Not binary cross-entropy: it is meant for probabilities (a softmax over two columns included).
_CROSS_ENTROPY_INPUT = re.compile(r"(?i)(?<!binary_)(?<!binary)cross_?entropy.*_input_0$")


def probability_rows(array: np.ndarray, tolerance: float) -> bool:
    """Whether ``array`` (N x C x ...) holds a probability distribution over axis 1 in every row."""
    if array.ndim < 2 or array.shape[1] < 2 or array.size == 0 or array.dtype.kind != "f":
        return False
    values = array.astype(np.float64)
    if not np.all(np.isfinite(values)) or values.min() < 0 or values.max() > 1:
        return False
    return bool(np.all(np.abs(values.sum(axis=1) - 1.0) <= tolerance))


class ProbabilitiesIntoCrossEntropy(Rule):
    """A cross-entropy loss gets probabilities (a Softmax before it), not raw logits."""

    rule_name = "ProbabilitiesIntoCrossEntropy"
    collections = ("predictions",)
    # Keras' categorical_crossentropy takes probabilities by default (from_logits=False): only
    # PyTorch's cross-entropy applies its own log-softmax.
    frameworks = ("pytorch",)
    fix_hint = (
        "remove the Softmax before the loss: CrossEntropyLoss applies log-softmax itself and expects raw "
        "logits (apply softmax only for predictions at inference time, or use LogSoftmax with NLLLoss)"
    )
    fix_hints = {
        "pytorch": (
            "remove the nn.Softmax / F.softmax before nn.CrossEntropyLoss: it applies log_softmax itself and "
            "expects raw logits (softmax only when reading predictions, or LogSoftmax with nn.NLLLoss)"
        ),
    }

    stop_policy = "reports only, never certain: training with softmax outputs still runs, slowly"

    tolerance = Param(float, 1e-3, "how far a row's sum may be from 1",
                      check=lambda value: None if 0 < value < 0.5 else "must be in (0, 0.5)")

    def validate(self) -> None:
        self._seen_any = False

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        names = [name for name in trial.tensor_names(step=step, collection="predictions")
                 if _CROSS_ENTROPY_INPUT.search(name)] if "predictions" in trial.collections() else []  # fmt: skip
        if not names:
            if trial.training_ended and not self._seen_any:
                if "predictions" in trial.collections() and trial.tensor_names(step=step):
                    # predictions were saved, none of a cross-entropy loss: a regression, a BCE model
                    return self.not_applicable("the run has no cross-entropy loss (CrossEntropyLoss or "
                                               "F.cross_entropy)", step)
                return self.not_evaluated("no cross-entropy loss input was saved (collection 'predictions': "
                                          "the input 0 of a CrossEntropyLoss)", step)
            return None
        self._seen_any = True
        values = read_values(trial, names, step)
        for name, value in sorted(values.items()):
            array = np.asarray(value)
            if probability_rows(array, self.tolerance):
                return self.issue(
                    step,
                    f"{name}: every one of its {array.shape[0]} rows is a probability distribution over "
                    f"{array.shape[1]} classes (values in [0, 1], sums 1 within {fmt(self.tolerance)}): the loss "
                    "gets softmax outputs, and applies its own log-softmax on top",
                    tensor=name, classes=int(array.shape[1]),
                )
        return self.no_issue(step, tensors=sorted(values))
