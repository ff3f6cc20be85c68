"""LossNotDecreasing: the loss did not go down by ``diff_percent`` % over ``num_steps`` steps.

Formula, for each selected loss tensor ``L`` in the chosen mode (steps are that mode's steps):

    evaluate at saved step s when s >= last_evaluated + num_steps
    p = max{saved step p' : p' <= s - num_steps}          (no such p: not evaluated)
    decrease% = 100 * (L_p - L_s) / |L_p|
    fire if decrease% < diff_percent      (with diff_percent == 0: if decrease% <= 0)

This is SageMaker's documented intent: ``diff_percent`` is the "minimum percentage difference by
which the loss should decrease between num_steps". It reproduces the first deleted smdebug test
vector (fires at step 12 on .30 → .30). The second vector (``diff_percent=20``, expected first
firing at step 24) encoded the opposite reading, "fire if the loss *rose* by 20 %"; under the
documented reading that run fires at step 12 (0.30 did not fall 20 % below 0.30). The test's
reading is available explicitly as a negative value: ``diff_percent=-20`` tolerates a 20 % rise
and fires at step 24, exactly as that test expected.

``increase_threshold_percent`` (final docs) separates the two kinds of finding: a rise of more
than that percentage is reported as a *diverging* loss (lower the learning rate), anything else
as a *plateau*. A loss that becomes NaN/inf after a finite value fires as diverging; a
comparison with a non-finite earlier value is skipped.

Selection: ``collection_names`` ∪ ``tensor_regex`` ∪ (collection ``losses`` when
``use_losses_collection``). Mode: ``mode`` if given, else EVAL when the run has EVAL losses,
else TRAIN, else GLOBAL (the earlier documented order; the final docs say GLOBAL, which on a
run with TRAIN and EVAL steps would compare a validation loss with a training loss).
Defaults are the final documented ones (``diff_percent`` 0.1, earlier docs 0).

XGBoost runs (no ``losses``, default selection): the metrics where lower is better
(``validation-logloss``, ``train-rmse``; not auc/ndcg/map) are the losses, one step per round;
``validation-*``/``eval-*``/``test-*`` metrics play the EVAL role and are preferred, as EVAL is.
"""

from __future__ import annotations

import math
from typing import Any

from trainguard.modes import ModeKeys
from trainguard.rules.base import MissingTensor, Rule, StepResult
from trainguard.rules.builtin._losses import LossHistory, fmt, is_complete, parse_mode
from trainguard.rules.params import Param

_DIVERGING_HINT = (
    "the loss is rising: lower the learning rate or use a scheduler (torch.optim.lr_scheduler), "
    "clip gradients (torch.nn.utils.clip_grad_norm_), and check the loss gets the model's raw outputs"
)
_PLATEAU_HINT = (
    "the loss is flat: if it never dropped, raise the learning rate, check that the optimizer "
    "receives model.parameters() and that labels match their inputs; if it flattened after "
    "progress, training has converged: stop early or decay the learning rate"
)


def _mode_check(value: Any) -> str | None:
    try:
        parse_mode(value)
    except Exception as error:  # noqa: BLE001 - reported as the parameter's error
        return str(error)
    return None


class LossNotDecreasing(Rule):
    """The loss stopped going down (or went up) over a window of steps."""

    rule_name = "LossNotDecreasing"
    collections = ("losses",)
    fix_hint = _PLATEAU_HINT

    collection_names = Param(list, None, "collections holding the losses to check", optional=True)
    tensor_regex = Param(list, None, "regexes of the loss tensors to check (scalars)", optional=True)
    use_losses_collection = Param(bool, True, "also check the 'losses' collection")
    num_steps = Param(int, 10, "compare with the loss at least this many (mode) steps earlier",
                      check=lambda value: None if value > 0 else "must be > 0")
    diff_percent = Param(float, 0.1, "minimum % by which the loss must decrease over num_steps "
                         "(negative: tolerated % increase)", documented_default="0.1 (earlier docs: 0)",
                         check=lambda value: None if -100 < value < 100 else "must be between -100 and 100")
    increase_threshold_percent = Param(float, 5.0, "a rise above this % is reported as diverging, not a plateau",
                                       check=lambda value: None if value >= 0 else "must be >= 0")
    mode = Param(str, None, "TRAIN, EVAL or GLOBAL; default: EVAL if present, else TRAIN, else GLOBAL",
                 optional=True, check=_mode_check, documented_default="GLOBAL (final docs); None (earlier docs)")

    def validate(self) -> None:
        self._mode = parse_mode(self.mode)
        self._history = LossHistory(
            self,
            collection_names=self.collection_names,
            tensor_regex=self.tensor_regex,
            use_losses_collection=self.use_losses_collection,
        )
        self._last_evaluated: dict[tuple[str, ModeKeys], int] = {}

    def _resolved_mode(self) -> ModeKeys:
        if self._mode is not None:
            return self._mode
        modes = self._history.modes_with_losses()
        for mode in (ModeKeys.EVAL, ModeKeys.TRAIN):
            if mode in modes:
                return mode
        return ModeKeys.GLOBAL

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        history = self._history
        if not history.names():
            if trial.training_ended:
                return self.missing(step, MissingTensor("scalar loss tensors", "losses"))
            return None
        current = history.values_at(step)
        if history.from_metrics:
            # XGBoost: one step per round, the roles are in the names (validation-logloss)
            role = self._mode or (ModeKeys.EVAL if history.role_names(ModeKeys.EVAL) else ModeKeys.TRAIN)
            wanted = set(history.names()) if role == ModeKeys.GLOBAL else history.role_names(role)
            current = {name: value for name, value in current.items() if name in wanted}
            mode, shown = ModeKeys.GLOBAL, role
        else:
            mode = shown = self._resolved_mode()
            if mode != ModeKeys.GLOBAL and trial.mode(step) != mode:
                return None
        if not current:
            return None
        mode_step = step if mode == ModeKeys.GLOBAL else trial.mode_step(step)
        evaluated: dict[str, dict[str, Any]] = {}
        fired: list[tuple[str, dict[str, Any]]] = []
        for name, value in sorted(current.items()):
            key = (name, mode)
            last = self._last_evaluated.get(key)
            if last is not None and mode_step < last + self.num_steps:
                continue
            earlier = [p for p in trial.tensor(name).steps(mode) if p <= mode_step - self.num_steps]
            if not earlier:
                continue
            previous_step = earlier[-1]
            previous_global = previous_step if mode == ModeKeys.GLOBAL else trial.global_step(mode, previous_step)
            previous = history.values_at(previous_global).get(name)
            if previous is None:
                continue
            self._last_evaluated[key] = mode_step
            facts = self._compare(name, previous, value, previous_step, mode_step)
            if facts is None:
                continue
            evaluated[name] = facts
            if facts["fired"]:
                fired.append((name, facts))
        if not evaluated:
            return None
        if fired:
            diverging = [item for item in fired if item[1]["kind"] == "diverging"]
            name, facts = (diverging or fired)[0]
            return self.issue(
                step,
                facts["message"],
                fix_hint=_DIVERGING_HINT if diverging else _PLATEAU_HINT,
                mode=shown.name,
                losses={key: {k: v for k, v in item.items() if k != "message"} for key, item in evaluated.items()},
            )
        return self.no_issue(step, mode=shown.name, losses=evaluated)

    def _compare(
        self, name: str, previous: float, value: float, previous_step: int, step: int
    ) -> dict[str, Any] | None:
        if not math.isfinite(previous):
            return None  # nothing to compare with; ExplodingTensor reports the NaN itself
        where = f"{name}: {fmt(previous)} at step {previous_step} → {fmt(value)} at step {step}"
        if not math.isfinite(value):
            return {"fired": True, "kind": "diverging", "previous": previous, "value": value,
                    "decrease_percent": None, "message": f"loss became non-finite ({where})"}
        if previous == 0:
            decrease = 0.0 if value == 0 else math.copysign(math.inf, -value)
        else:
            decrease = 100.0 * (previous - value) / abs(previous)
        required = self.diff_percent
        fired = decrease <= 0 if required == 0 else decrease < required
        kind = "diverging" if -decrease > self.increase_threshold_percent else "plateau"
        if not fired:
            message = ""
        elif kind == "diverging":
            message = f"loss rose by {fmt(-decrease)} % over {self.num_steps} steps ({where})"
        else:
            message = (f"loss decreased by {fmt(decrease)} %, less than diff_percent={fmt(required)} %, "
                       f"over {self.num_steps} steps ({where})")
        return {"fired": fired, "kind": kind, "previous": previous, "value": value,
                "previous_step": previous_step, "decrease_percent": decrease, "message": message}
