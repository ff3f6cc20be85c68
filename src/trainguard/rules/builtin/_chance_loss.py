"""What a uniform guess scores under a run's cross-entropy loss: the level no classifier should stay above.

A cross-entropy over C classes gives ``log C`` per scored position to a model that outputs the
same score for every class (all-zero logits): any initialisation with logits of order 1 starts
near it, and training goes below it. A training loss far above it, step after step, is a model
worse than knowing nothing: its logits are orders of magnitude too large (activations that grow
through the layers or the time steps of an initialisation far too large, inputs far off scale,
a learning rate far too high), even while that loss falls.

The loss's reduction is not saved (mean, sum, a weighted mean), so the level used here is the
largest a uniform guess can score under any of them: ``log C`` summed over every scored position
of the batch (N for N x C scores, N x T for per-token N x C x T ones). A mean-reduced loss must then
be N times above chance to count: only logits far out of scale reach that.

C and the positions come from the cross-entropy loss's input 0 (collection ``predictions``,
``<...CrossEntropy...>_input_0``; not binary cross-entropy, whose chance level depends on the
label balance).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from trainguard.rules.builtin._losses import read_values

__all__ = ["chance_level"]

_CROSS_ENTROPY_INPUT = re.compile(r"(?i)(?<!binary_)(?<!binary)cross_?entropy.*_input_0$")

def chance_level(trial: Any, step: int) -> dict[str, float | int] | None:
    """``{"classes", "positions", "per_position", "bound"}`` of the run's cross-entropy at ``step``
    (``bound``: log C summed over the scored positions), or None when no cross-entropy input was
    saved there."""
    if "predictions" not in trial.collections():
        return None
    names = [name for name in trial.tensor_names(step=step, collection="predictions")
             if _CROSS_ENTROPY_INPUT.search(name)]  # fmt: skip
    for _, value in sorted(read_values(trial, names, step).items()):
        shape = np.shape(value)
        if len(shape) < 2 or shape[1] < 2:
            continue
        classes = int(shape[1])
        positions = int(np.prod(shape)) // classes
        per_position = math.log(classes)
        return {"classes": classes, "positions": positions, "per_position": per_position,
                "bound": per_position * positions}
    return None
