"""Whole validation passes: the losses of every EVAL step of a pass, up to a bound.

Overfit and Overtraining compare validation *passes*. Saved at an interval counted in EVAL steps
(every 10th), an 8-batch pass keeps one batch at a different position each time (0, 2, 4, 6,
none, 0...), and the rules would compare one batch against another: a healthy run whose mean
validation loss falls can look like one whose loss rises. So the ``losses`` collection (scalars:
a few bytes per step) is saved at the first ``limit`` steps of every EVAL pass, whatever the
schedule; the other collections keep theirs. Passes shorter than the bound are saved whole;
longer ones keep the same first ``limit`` batches each pass (a validation loader is usually not
shuffled), which is what the rules then compare. The bound keeps a long validation pass (say
10,000 batches) from saving 10,000 steps per pass: at most ``limit`` losses-only steps per pass.

A pass is told apart without the script's help: the hook counts its global step in every mode,
so ``global step - EVAL mode step`` is the same for every step of one pass and changes whenever
a step of another mode ran in between.

The collections file's ``_meta`` says so (``eval_pass_steps``: the bound), so that a rule knows
that the first saved loss step of each pass is its first batch (trainguard.rules.builtin._eval_passes).

An EVAL schedule the user set for itself (``SaveConfig(mode_save_configs={modes.EVAL: ...})``,
DebugHookConfig's ``eval.*`` keys) is kept exactly (the bound is 0 then).
``TRAINGUARD_EVAL_PASS_STEPS`` sets the bound (default :data:`DEFAULT_EVAL_PASS_STEPS`; 0 turns it
off: the schedule alone decides, and the rules only compare passes they can show are whole).
"""

from __future__ import annotations

import logging
import os

__all__ = ["DEFAULT_EVAL_PASS_STEPS", "EVAL_PASS_ENV", "PASS_COLLECTIONS", "EvalPassSaves"]

logger = logging.getLogger("trainguard")

DEFAULT_EVAL_PASS_STEPS = 64
EVAL_PASS_ENV = "TRAINGUARD_EVAL_PASS_STEPS"
# Saved at every step of a pass: what the validation-loss rules read, and cheap (scalars)
PASS_COLLECTIONS = frozenset({"losses"})


def _limit_from_environment() -> int:
    raw = os.environ.get(EVAL_PASS_ENV, "").strip()
    if not raw:
        return DEFAULT_EVAL_PASS_STEPS
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        # fail open: a typo in an environment variable must not stop training
        logger.warning(
            "trainguard: %s=%r is not a whole number >= 0; using %d", EVAL_PASS_ENV, raw, DEFAULT_EVAL_PASS_STEPS
        )
        return DEFAULT_EVAL_PASS_STEPS
    return value


class EvalPassSaves:
    """Which collections an EVAL step saves because it is among the first ``limit`` of its pass.

    :meth:`due` is asked once or twice per EVAL step (again when a collection is included mid-step)
    and answers from the step numbers alone, so asking twice gives the same answer.
    """

    __slots__ = ("limit", "_pass_offset", "_pass_start")

    def __init__(self, limit: int | None = None) -> None:
        self.limit = _limit_from_environment() if limit is None else max(0, int(limit))
        self._pass_offset: int | None = None  # global step - mode step of the current pass
        self._pass_start = 0  # EVAL mode step of the current pass's first step

    def due(self, step: int, mode_step: int, included: list[str]) -> frozenset[str]:
        """The pass collections among ``included`` that EVAL step (``step``, ``mode_step``) saves."""
        if not self.limit:
            return frozenset()
        offset = step - mode_step
        if offset != self._pass_offset:  # a step of another mode ran since the last EVAL step: a new pass
            self._pass_offset, self._pass_start = offset, mode_step
        if mode_step - self._pass_start >= self.limit:
            return frozenset()
        return PASS_COLLECTIONS.intersection(included)

    def facts(self, included: list[str]) -> dict[str, object]:
        """For the collections file's ``_meta``: the bound, when a pass collection is included."""
        if self.limit and PASS_COLLECTIONS.intersection(included):
            return {"eval_pass_steps": self.limit}
        return {}
