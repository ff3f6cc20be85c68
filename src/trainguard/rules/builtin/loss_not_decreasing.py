"""LossNotDecreasing: the loss stopped going down (or went up), judged against its own noise.

Calibrated semantics (the default). Mini-batch losses are noisy: two single losses ``num_steps``
apart "rise" half the time on a healthy run. The rule therefore compares *windows* of ``window``
saved losses of each selected loss tensor, evaluated every ``num_steps`` mode steps:

* non-finite: the newest loss is NaN/inf: fires at once, certain (training does not recover
  from a NaN loss);
* diverging: with A, B, C the last three windows (oldest first), B and C are both above A
  by a one-sided Mann-Whitney rank test at p < ``alpha`` and mean(C) is more than
  ``increase_threshold_percent`` % above mean(A). Ranks make one outlier batch count as one
  value; asking it of two windows in a row makes a transient bump (a hard batch streak, a
  warm-up wobble) silent. Certain when every value of B and C is above every value of A;
* risen above its start (certain): with S the run's first saved loss (the loss before training
  changed anything) and B, C as above, every loss of B and C is above S, and their median is
  above S by more than ``increase_threshold_percent`` % and by more than the noise allows: the
  one-sided z-test of S as one draw against the median of B ∪ C, at level ``alpha``, with the
  noise of one value measured in B ∪ C itself (``robust_sd``: second differences, so neither a
  trend nor an outlier inflates it). This is a loss that rose at once and stayed up (a tanh RNN
  language model at a far too high learning rate: 6.3 at step 0, 10-20 ever after), which the
  window comparison cannot see: its reference window is already up. A healthy run is below its
  first loss within its first two windows (its first loss would have to be a draw more than
  ``alpha``-unlikely for the median to clear the margin); a loss that is not minimised towards
  a floor (a policy-gradient surrogate with unnormalised returns, which grows as returns grow)
  rises on a healthy run too, and the rule cannot tell that apart from a divergence;
* far above chance (certain): the same test with the cross-entropy's chance level in place of S
  (``_chance_loss``: log C summed over the batch's scored positions, the most a uniform guess
  scores under any reduction). Logits orders of magnitude too large from the start (a ReLU RNN
  whose recurrent weights grow its state through the time steps) give a loss of 10^8 that falls
  but stays 10^6 above chance: neither window comparison nor the start sees it;
* not learning (reported, never certain): with F the first ``window`` saved losses of the run
  and R up to the last 2 x ``window`` after them, the loss fell from mean(F) to mean(R) by less
  than ``min_progress_percent`` % with 99.5 % confidence (Welch's standard error of the
  difference of the means). A noisy run is never "flat" for lack of evidence; a run that
  converged is far below its start. Judged twice:

  - while training, at each evaluation once 3 x ``window`` losses are saved (R then follows F
    without overlap), and only when the last 3 x ``window`` losses show no falling trend either
    (Mann-Kendall ``trend_z`` > -1.645, one-sided 5 %). A run on a plateau it is leaving (a
    CNN's or a deep MLP's slow start, 1.38 for 20 steps and then falling) already shows the
    trend, and a lenient level makes the faintest sign of one hold the verdict back. A run that
    sits perfectly flat for 3 windows and only then learns (an XOR net at ln 2 for hundreds of
    steps) is reported while it is flat: from the losses so far it cannot be told from a run
    that never learns (no updates, a learning rate far too small, softmax before the loss).
    This is why it is reported and never stops training;
  - when training ended, over the whole run (R the last losses), without the trend condition:
    a run that learned a little and flattened is judged on where it ended.

What it cannot tell apart: a loss that falls is learning, whatever it learns. MSE between one
output and the class index (a classification trained as a regression) falls as a healthy
regression's loss does, and no saved tensor says the float targets are classes, so no rule
reports it; only the program's own accuracy (chance) shows it.

Competing objectives: in a run whose hook saw two or more optimizers step disjoint sets of
parameters (a GAN's generator and discriminator, an actor and a critic; the collections file's
``independent_optimizers``), each loss is minimised against the other model, and a rising or
flat loss is the game, not a fault (measured: a healthy GAN's discriminator loss rose 40 % towards
its equilibrium, 0.84 → 1.37, and the rule stopped it). Such runs get the non-finite check only.

Losses judged: the training mini-batch losses (mode TRAIN; GLOBAL when the run has no TRAIN
steps; ``mode`` picks another). A rising validation loss is Overfit's and Overtraining's
finding, not this rule's. The rule needs 2 x ``window`` saved losses before it can judge (a
rise needs 3 x ``window``); a run with fewer (or with no loss tensors) ends "not evaluated".

SageMaker semantics (``semantics="sagemaker"``): the documented single-step condition below.

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
calibrated semantics judge the ``train-*`` metrics (boosting progress); under SageMaker
semantics ``validation-*``/``eval-*``/``test-*`` metrics play the EVAL role and are preferred.

Cost: every saved loss is read once and kept in a window per tensor; an evaluation costs
O(window log window) whatever the length of the run.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

from trainguard.modes import ModeKeys
from trainguard.rules.base import Rule, StepResult
from trainguard.rules.builtin._chance_loss import chance_level
from trainguard.rules.builtin._loss_hints import ABOVE_CHANCE_HINT, ABOVE_CHANCE_HINTS
from trainguard.rules.builtin._loss_hints import DIVERGING_HINT as _DIVERGING_HINT
from trainguard.rules.builtin._loss_hints import DIVERGING_HINTS as _DIVERGING_HINTS
from trainguard.rules.builtin._loss_hints import PLATEAU_HINT as _PLATEAU_HINT
from trainguard.rules.builtin._loss_hints import PLATEAU_HINTS as _PLATEAU_HINTS
from trainguard.rules.builtin._loss_stats import decrease_upper_bound, mann_whitney_p, mean, robust_sd, trend_z
from trainguard.rules.builtin._losses import LossHistory, fmt, is_complete, parse_mode
from trainguard.rules.params import SAGEMAKER, Param, semantics_param

# Mann-Kendall z below which the recent losses are falling (one-sided 5 %): a run leaving a
# plateau is not judged "not learning" while it still trains.
_FALLING_Z = 1.645


def _mode_check(value: Any) -> str | None:
    try:
        parse_mode(value)
    except Exception as error:  # noqa: BLE001 - reported as the parameter's error
        return str(error)
    return None


class _Series:
    """One loss tensor's calibrated state: its first window and its last three windows."""

    def __init__(self, window: int) -> None:
        self.first: list[float] = []
        self.recent: deque[float] = deque(maxlen=3 * window)
        self.count = 0  # finite values seen
        self.last_evaluated: int | None = None
        self.latest: float | None = None  # the newest value, finite or not
        self.latest_step = -1

    def add(self, value: float, mode_step: int, window: int) -> None:
        self.latest, self.latest_step = value, mode_step
        if not math.isfinite(value):
            return
        self.count += 1
        if len(self.first) < window:
            self.first.append(value)
        self.recent.append(value)


class LossNotDecreasing(Rule):
    """The loss stopped going down (or went up) over a window of steps."""

    rule_name = "LossNotDecreasing"
    collections = ("losses",)
    fix_hint = _PLATEAU_HINT
    fix_hints = _PLATEAU_HINTS
    stop_policy = (
        "stops training on a NaN/inf loss, on a rise confirmed over two windows in which every "
        "loss is above every loss of the window before, or on two windows of losses all above the "
        "run's first loss beyond their noise; a flat loss is reported only"
    )

    collection_names = Param(list, None, "collections holding the losses to check", optional=True)
    tensor_regex = Param(list, None, "regexes of the loss tensors to check (scalars)", optional=True)
    use_losses_collection = Param(bool, True, "also check the 'losses' collection")
    num_steps = Param(int, 10, "evaluate every this many (mode) steps; SageMaker semantics: compare with "
                      "the loss at least this many steps earlier",
                      check=lambda value: None if value > 0 else "must be > 0")
    diff_percent = Param(float, 0.1, "SageMaker semantics: minimum % by which the loss must decrease over "
                         "num_steps (negative: tolerated % increase)", documented_default="0.1 (earlier docs: 0)",
                         check=lambda value: None if -100 < value < 100 else "must be between -100 and 100")
    increase_threshold_percent = Param(float, 5.0, "a rise above this % is reported as diverging, not a plateau",
                                       check=lambda value: None if value >= 0 else "must be >= 0")
    mode = Param(str, None, "TRAIN, EVAL or GLOBAL; default: TRAIN if present, else GLOBAL (SageMaker "
                 "semantics: EVAL if present, else TRAIN, else GLOBAL)",
                 optional=True, check=_mode_check, documented_default="GLOBAL (final docs); None (earlier docs)")
    semantics = semantics_param()
    window = Param(int, 8, "calibrated: saved losses per compared window",
                   check=lambda value: None if value >= 3 else "must be >= 3")
    alpha = Param(float, 0.001, "calibrated: significance level of each window comparison",
                  check=lambda value: None if 0 < value < 0.5 else "must be in (0, 0.5)")
    min_progress_percent = Param(float, 5.0, "calibrated: a loss that surely fell less than this % from the "
                                 "run's first window is 'not learning'",
                                 check=lambda value: None if 0 <= value < 100 else "must be in [0, 100)")

    def validate(self) -> None:
        self._mode = parse_mode(self.mode)
        self._history = LossHistory(
            self,
            collection_names=self.collection_names,
            tensor_regex=self.tensor_regex,
            use_losses_collection=self.use_losses_collection,
        )
        self._last_evaluated: dict[tuple[str, ModeKeys], int] = {}
        self._series: dict[str, _Series] = {}
        self._series_mode: tuple[ModeKeys, frozenset[str] | None] | None = None
        self._consumed = -1  # last global loss step added to the calibrated windows
        self._judged = False
        self._last_step = -1
        self._chance: dict[str, float | int] | None = None  # a uniform guess's loss (_chance_loss)

    # -- shared ------------------------------------------------------------------------------
    def finish(self) -> StepResult | None:
        if not self._history.names():
            return self.not_evaluated("no scalar loss tensors were saved (save the 'losses' collection)",
                                      self._last_step)
        if not self._judged:
            have = max((series.count for series in self._series.values()), default=0)
            if self.semantics == SAGEMAKER:
                why = f"no loss was saved {self.num_steps} steps after an earlier one"
            else:
                why = (f"{have} finite saved loss(es) of the judged mode; the rule compares windows and needs "
                       f"2 x window = {2 * self.window}")
            return self.not_evaluated(why, self._last_step)
        if self.semantics != SAGEMAKER:
            return self._plateau()
        return None

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        self._last_step = max(self._last_step, step)
        if not self._history.names():
            return None
        if self.semantics == SAGEMAKER:
            return self._check_sagemaker(step)
        return self._check_calibrated(step)

    # -- calibrated ----------------------------------------------------------------------------
    def _calibrated_selection(self) -> tuple[ModeKeys, frozenset[str] | None]:
        history = self._history
        if history.from_metrics:
            # XGBoost: one GLOBAL step per round; the training metrics show boosting progress
            names = history.role_names(ModeKeys.TRAIN) or history.role_names(ModeKeys.EVAL)
            return ModeKeys.GLOBAL, frozenset(names)
        if self._mode is not None:
            return self._mode, None
        return (ModeKeys.TRAIN if ModeKeys.TRAIN in history.modes_with_losses() else ModeKeys.GLOBAL), None

    def _check_calibrated(self, step: int) -> StepResult | None:
        trial = self.base_trial
        history = self._history
        selection = self._calibrated_selection()
        if selection != self._series_mode:  # the first TRAIN step arrived, or a new metric: start over
            self._series_mode, self._series, self._consumed = selection, {}, -1
        mode, names = selection
        for saved in history.loss_steps(mode, upto=step, after=self._consumed):
            self._consumed = saved
            mode_step = saved if mode == ModeKeys.GLOBAL else trial.mode_step(saved)
            for name, value in history.values_at(saved).items():
                if names is None or name in names:
                    self._series.setdefault(name, _Series(self.window)).add(value, mode_step, self.window)
        if step != self._consumed:
            return None  # not a loss step of the judged mode
        mode_step = step if mode == ModeKeys.GLOBAL else trial.mode_step(step)
        evaluated: dict[str, dict[str, Any]] = {}
        for name, series in sorted(self._series.items()):
            if series.latest_step != mode_step:
                continue
            if series.latest is not None and not math.isfinite(series.latest):
                evaluated[name] = {"kind": "non-finite", "fired": True, "certain": True, "value": series.latest,
                                   "message": f"{name}: loss became {series.latest} at step {mode_step}"}
                continue
            if series.last_evaluated is not None and mode_step < series.last_evaluated + self.num_steps:
                continue
            if series.count < 2 * self.window:
                continue
            series.last_evaluated = mode_step
            self._chance = self._chance or chance_level(trial, step)
            evaluated[name] = self._judge_windows(name, series, mode_step)
            if evaluated[name]["fired"] and self._competing():
                evaluated[name].update(kind="competing objectives", fired=False, certain=False)
        if not evaluated:
            return None
        self._judged = True
        shown = "TRAIN" if names is not None else mode.name
        fired = [(name, facts) for name, facts in evaluated.items() if facts["fired"]]
        losses = {name: {k: v for k, v in facts.items() if k != "message"} for name, facts in evaluated.items()}
        if not fired:
            return self.no_issue(step, mode=shown, losses=losses)
        diverging = [item for item in fired if item[1]["kind"] in ("non-finite", "diverging", "risen", "above chance")]
        name, facts = (diverging or fired)[0]
        framework = self.framework()
        hints = _DIVERGING_HINTS if diverging else _PLATEAU_HINTS
        hint = hints.get(framework or "", _DIVERGING_HINT if diverging else _PLATEAU_HINT)
        if facts["kind"] == "above chance":
            hint = ABOVE_CHANCE_HINTS.get(framework or "", ABOVE_CHANCE_HINT)
        return self.issue(step, facts["message"], fix_hint=hint, certain=bool(facts["certain"]),
                          mode=shown, losses=losses)

    def _judge_windows(self, name: str, series: _Series, mode_step: int) -> dict[str, Any]:
        width = self.window
        values = list(series.recent)
        facts: dict[str, Any] = {"kind": "none", "fired": False, "certain": False, "message": ""}
        if len(values) >= 3 * width:
            before, middle, current = values[:width], values[width:2 * width], values[2 * width:]
            p_middle = mann_whitney_p(before, middle)
            p_current = mann_whitney_p(before, current)
            base = mean(before)
            rise = 100.0 * (mean(current) - base) / (abs(base) or 1.0)
            facts.update(p_rise=max(p_middle, p_current), rise_percent=rise)
            if p_middle < self.alpha and p_current < self.alpha and rise > self.increase_threshold_percent:
                certain = min(middle + current) > max(before)
                facts.update(
                    kind="diverging", fired=True, certain=certain,
                    message=f"{name}: loss rose by {fmt(rise)} % (mean of {width} saved losses {fmt(base)} → "
                    f"{fmt(mean(current))} at step {mode_step}); the two windows after the first are both above it "
                    f"(rank test p = {fmt(max(p_middle, p_current))} < alpha {fmt(self.alpha)})"
                    + ("; every loss of them is above every loss before" if certain else ""),
                )
                return facts
        if len(values) >= 2 * width and series.count > 2 * width:
            self._judge_start(name, series, values[-2 * width:], mode_step, facts)
        if not facts["fired"] and series.count >= 3 * width:
            self._judge_flat(name, series, values, mode_step, facts)
        return facts

    def _judge_flat(
        self, name: str, series: _Series, recent: list[float], mode_step: int, facts: dict[str, Any]
    ) -> None:
        """The "not learning" check while training (module docstring): ``recent`` is the last 3 windows."""
        after = recent[-2 * self.window:]
        decrease, upper = decrease_upper_bound(series.first, after)
        trend = trend_z(recent)
        facts.update(decrease_percent=100 * decrease, decrease_upper_percent=100 * upper, trend_z=trend)
        if upper >= self.min_progress_percent / 100 or trend <= -_FALLING_Z:
            return
        facts.update(
            kind="plateau", fired=True, certain=False, start=mean(series.first), current=mean(after),
            message=f"{name}: the loss is not learning: the last {len(after)} saved losses (to step {mode_step}) "
            f"average {fmt(mean(after))}, {fmt(100 * decrease)} % below its start {fmt(mean(series.first))} (the first "
            f"{len(series.first)}): surely less than min_progress_percent {fmt(self.min_progress_percent)} % (99.5 % "
            f"bound {fmt(100 * upper)} %), and the last {len(recent)} show no falling trend (z = {fmt(trend)})",
        )

    def _judge_start(
        self, name: str, series: _Series, recent: list[float], mode_step: int, facts: dict[str, Any]
    ) -> None:
        """The "risen above its start" and "far above chance" checks (module docstring): ``recent`` is B ∪ C."""
        start = series.first[0]
        level = statistics.median(recent)
        noise = robust_sd(recent)
        # the start is one draw, the median of n draws has a standard error of sqrt(pi / 2n) draws
        margin = statistics.NormalDist().inv_cdf(1 - self.alpha) * noise * math.sqrt(1 + math.pi / (2 * len(recent)))
        chance = self._chance
        for kind, reference in (("risen", start), ("above chance", chance["bound"] if chance else None)):
            if reference is None:
                continue
            rise = 100.0 * (level - reference) / (abs(reference) or 1.0)
            facts.update({"start": start, "start_rise_percent": rise} if kind == "risen" else
                         {"chance": reference, "chance_rise_percent": rise})  # fmt: skip
            if not (min(recent) > reference and level - reference > margin and rise > self.increase_threshold_percent):
                continue
            if kind == "risen" or chance is None:
                what = f"is above the first, {fmt(start)}; their median {fmt(level)} is {fmt(rise)} % higher"
            else:
                what = (f"is above {fmt(reference)}, what a uniform guess over {chance['classes']} classes scores even "
                        f"summed over the batch's {chance['positions']} positions (log {chance['classes']} = "
                        f"{fmt(float(chance['per_position']))} each); their median is {fmt(level)}")
            how = "rose above its start and stayed there" if kind == "risen" else "stays far above chance"
            facts.update(
                kind=kind, fired=True, certain=True,
                message=f"{name}: loss {how}: every one of the last {len(recent)} saved losses (to step {mode_step}) "
                f"{what}, beyond their noise ({fmt(noise)} per value, margin {fmt(margin)})",
            )
            return

    def _competing(self) -> bool:
        return getattr(self.base_trial, "independent_optimizers", 1) > 1

    def _plateau(self) -> StepResult | None:
        """The whole-run "not learning" verdict (calibrated), given when training ended."""
        if self._competing():
            return None
        width = self.window
        for name, series in sorted(self._series.items()):
            if series.count < 2 * width:
                continue
            first = series.first
            after = list(series.recent)[-min(2 * width, series.count - width):]
            decrease, upper = decrease_upper_bound(first, after)
            if upper >= self.min_progress_percent / 100:
                continue
            facts = {"kind": "plateau", "fired": True, "certain": False, "decrease_percent": 100 * decrease,
                     "decrease_upper_percent": 100 * upper, "start": mean(first), "current": mean(after)}
            hint = _PLATEAU_HINTS.get(self.framework() or "", _PLATEAU_HINT)
            mode, names = self._series_mode or (ModeKeys.GLOBAL, None)
            return self.issue(
                self._last_step,
                f"{name}: the loss did not learn: it ended at {fmt(mean(after))} (mean of the last {len(after)} "
                f"saved losses, step {series.latest_step}), {fmt(100 * decrease)} % below its start "
                f"{fmt(mean(first))} (the first {len(first)}): surely less than min_progress_percent "
                f"{fmt(self.min_progress_percent)} % (99.5 % bound {fmt(100 * upper)} %)",
                fix_hint=hint, mode="TRAIN" if names is not None else mode.name, losses={name: facts},
            )
        return None

    # -- SageMaker semantics -----------------------------------------------------------------
    def _resolved_mode(self) -> ModeKeys:
        if self._mode is not None:
            return self._mode
        modes = self._history.modes_with_losses()
        for mode in (ModeKeys.EVAL, ModeKeys.TRAIN):
            if mode in modes:
                return mode
        return ModeKeys.GLOBAL

    def _check_sagemaker(self, step: int) -> StepResult | None:
        trial = self.base_trial
        history = self._history
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
            earlier = history.before_mode_step(mode, mode_step - self.num_steps, name)
            if earlier is None:
                continue
            previous_step, previous_global = earlier
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
        self._judged = True
        if fired:
            diverging = [item for item in fired if item[1]["kind"] == "diverging"]
            name, facts = (diverging or fired)[0]
            framework = self.framework() or ""
            hint = (_DIVERGING_HINTS.get(framework, _DIVERGING_HINT) if diverging
                    else _PLATEAU_HINTS.get(framework, _PLATEAU_HINT))
            return self.issue(
                step,
                facts["message"],
                fix_hint=hint,
                certain=any(not math.isfinite(item[1]["value"]) for item in diverging),
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
