"""An overhead budget: save less often when saving costs more than a set share of training time.

A saved step of a small, fast model costs about as much as several training steps (Python calls
per tensor, the writer's encoding and two files per step), so a fixed interval of 10 steps can
add 10-50 % to a 1 ms step. With a budget, the hook keeps the configured schedule for its first
``warmup_saves`` saves (early faults are caught exactly as configured),
then measures what the capture costs and thins its TRAIN saves until it fits in ``fraction`` of
the training time (after as few as ``EARLY_SAVES`` measured saves when saving costs more than
``EARLY_FACTOR`` times the budget): first the heavy collections (weights, gradients, outputs...), down to one
save every ``max_interval`` steps (SageMaker's default interval); then, if saving only the light
ones (losses, scalars, metrics: a few numbers per step) still costs too much, those too, down to
one save every ``max_light_interval`` steps. Both keep a regular subset of their configured steps;
when the capture gets cheaper (a slower phase of training), the thinning is undone step by step.

A floor under the thinning: the first ``light_floor`` configured TRAIN saves always keep the light
collections, and the first ``heavy_floor`` the heavy ones, whatever saving costs, so that a short
or fast run still holds what the default rules need to judge it at all. LossNotDecreasing compares
windows of 8 saved losses and needs three of them to see a rise (two for a plateau): 24 losses;
the windowed tensor rules (WeightUpdateRatio, ExplodingTensor, VanishingGradient, DeadRelu, ...)
judge a window of 5 evaluations, WeightUpdateRatio each against the save 4 before: 6 saves of
weights and gradients. The floor costs at most that many saves more than the thinning would keep,
once per run, whatever its length; a run whose schedule has fewer configured saves keeps them all.

How cost is measured, without timing every step: the hook marks the time at the begin of every
saved step and of the last unsaved step before it (the adapters that skip unsaved steps mark
that one). A span starting at a saved step, minus that many steps of plain training (the median
one-step span of unsaved steps), is what the save added to the training thread, cache misses
included. The writer's cost over the same window is added: its CPU time (on a busy machine it
competes with training for a core) and the seconds training waited for it (a full queue).

The time is the training thread's CPU time (:class:`TrainingThreadClock`), not the wall clock:
seconds in which the process does not run (another process has its core, it is stopped, it
sleeps waiting for data) are neither training time to take a share of nor a cost of saving.
On the wall clock, a job run in turns with other processes would read the time it is stopped as
training time, under-measure what saving costs, and keep heavy collections far more often than
the budget allows.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable

from trainguard.config.collections import SCALAR_COLLECTIONS

__all__ = ["LIGHT_COLLECTIONS", "OverheadBudget", "TrainingThreadClock"]

logger = logging.getLogger("trainguard")

# Collections of a few numbers per step: thinned only after the heavy ones.
LIGHT_COLLECTIONS = SCALAR_COLLECTIONS | {"hyperparameters"}
DEFAULT_WARMUP_SAVES = 20
DEFAULT_MAX_INTERVAL = 500
DEFAULT_MAX_LIGHT_INTERVAL = 100
# The floor (see above): the default rules' needs at their default parameters
# (tests/hooks/test_every_parameter_budget.py checks these against the rules' own defaults).
DEFAULT_LIGHT_FLOOR = 24  # LossNotDecreasing: 3 x window
DEFAULT_HEAVY_FLOOR = 6  # the persistence rules: window evaluations, plus the first reference
DECIDE_EVERY = 16  # saves in one measuring window
# ...but a window showing saving far over budget decides after this many saves, warm-up or not:
# at 10 steps apart, a reference-CNN step saving its activations (~0.7 of a step each, 7 % of
# training) or an MLP step saving anything (30 %) would otherwise keep that share for 270 steps.
EARLY_SAVES = 4
EARLY_FACTOR = 2.5
_SAMPLES = 33  # one-step spans the step time is the median of

QUIET, LIGHT, HEAVY = 0, 1, 2


class TrainingThreadClock:
    """CPU seconds of the thread that first reads this clock (the training thread: the budget's
    first mark comes from a step beginning), readable from any thread afterwards. Where a
    thread's clock cannot be read from another (no ``pthread_getcpuclockid``), the calling
    thread's own CPU time."""

    def __init__(self) -> None:
        self._clock_id: int | None = None
        self._bound = False

    def __call__(self) -> float:
        if not self._bound:
            self._bind()
        if self._clock_id is not None:
            try:
                return time.clock_gettime(self._clock_id)
            except OSError:  # the thread ended: the next reader's thread is training now
                self._bound = False
        return time.thread_time()

    def _bind(self) -> None:
        self._bound = True
        getter = getattr(time, "pthread_getcpuclockid", None)
        try:
            self._clock_id = getter(threading.get_ident()) if getter is not None else None
        except OSError:
            self._clock_id = None


class OverheadBudget:
    """Decides which configured TRAIN saves happen; told by the hook when steps begin."""

    def __init__(
        self,
        fraction: float,
        *,
        warmup_saves: int = DEFAULT_WARMUP_SAVES,
        max_interval: int = DEFAULT_MAX_INTERVAL,
        max_light_interval: int = DEFAULT_MAX_LIGHT_INTERVAL,
        light_floor: int = DEFAULT_LIGHT_FLOOR,
        heavy_floor: int = DEFAULT_HEAVY_FLOOR,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"overhead budget {fraction!r} must be a fraction between 0 and 1")
        self.fraction = fraction
        self.warmup_saves = warmup_saves
        self.max_interval = max_interval
        self.max_light_interval = min(max_light_interval, max_interval)  # heavy saves are light ones too
        self._clock = clock if clock is not None else TrainingThreadClock()
        self.light_stride = 1  # keep every light_stride-th configured save
        self.heavy_stride = 1  # ...and the heavy collections at every heavy_stride-th of those
        self.light_floor, self.heavy_floor = light_floor, heavy_floor
        self.light_kept = 0  # configured saves kept with the light collections so far
        self.heavy_kept = 0  # ...and with the heavy ones
        self.saves = 0
        self.last_share: float | None = None  # the capture's share of training time, last measured
        self._candidates = 0  # configured saves seen since the strides last changed
        self._decided: tuple[int, int] | None = None  # (mode step, QUIET/LIGHT/HEAVY) of the last one asked
        self._last_candidate: int | None = None
        self._gaps: deque[int] = deque(maxlen=_SAMPLES)
        self._last_mark: tuple[float, int, int] | None = None  # (time, step, kind)
        self._step_seconds: deque[float] = deque(maxlen=_SAMPLES)
        self._window: _Window | None = None

    @property
    def thinning(self) -> bool:
        return self.light_stride > 1 or self.heavy_stride > 1

    # -- which steps -----------------------------------------------------------------------
    def keep(self, mode_step: int) -> int:
        """HEAVY: save everything due at this configured TRAIN step; LIGHT: only the light
        collections; QUIET: nothing. The answer for one step never changes."""
        if self._decided is not None and self._decided[0] == mode_step:
            return self._decided[1]
        if self._last_candidate is not None and mode_step < self._last_candidate:
            # Asked ahead (SaveSchedule.unsaved_steps_ahead) and thinned then; asked again only
            # where a run of quiet steps was cut short (a mode change): the same answer.
            return QUIET
        if self._last_candidate is not None and mode_step > self._last_candidate:
            self._gaps.append(mode_step - self._last_candidate)
        self._last_candidate = mode_step
        index, self._candidates = self._candidates, self._candidates + 1
        if index % self.light_stride:
            kept = QUIET
        elif (index // self.light_stride) % self.heavy_stride:
            kept = LIGHT
        else:
            kept = HEAVY
        if kept == QUIET and self.light_kept < self.light_floor:
            kept = LIGHT
        if kept == LIGHT and self.heavy_kept < self.heavy_floor:
            kept = HEAVY
        self.light_kept += kept != QUIET
        self.heavy_kept += kept == HEAVY
        self._decided = (mode_step, kept)
        return kept

    # -- what it costs -----------------------------------------------------------------------
    def mark(self, step: int, kind: int, writer_cost: Callable[[], float | None] | None = None) -> None:
        """The training thread is at the begin of global ``step`` (QUIET: it saves nothing,
        LIGHT: light collections only, HEAVY: heavy ones too). ``writer_cost`` reads the
        writer's cost so far, in seconds: its CPU time and the time training waited for it
        (asked only when a measuring window starts or ends)."""
        now = self._clock()
        last, self._last_mark = self._last_mark, (now, step, kind)
        if kind != QUIET:
            self.saves += 1
        if last is not None and step > last[1]:
            span, steps = now - last[0], step - last[1]
            if last[2] == QUIET:
                if steps == 1:
                    self._step_seconds.append(span)
            elif self._window is not None:
                self._window.spans.append((span, steps, last[2]))
        if kind == QUIET or self.saves <= self.warmup_saves // 2:
            return  # the first saves pay one-off costs (imports, the writer starting)
        window = self._window
        if window is None:
            if kind == HEAVY:
                self._window = _Window(now, writer_cost() if writer_cost else None)
            return
        # A window spans whole periods of the heavy saves (from one to a later one): cut
        # anywhere else, it would see one costly save more or less than its share.
        ends = kind == HEAVY or (window.heavy == 0 and window.saves >= self.heavy_stride + DECIDE_EVERY)
        if ends and window.saves >= DECIDE_EVERY and self.saves >= self.warmup_saves:
            self._decide(now, writer_cost() if writer_cost else None)
            return
        if ends and window.saves >= EARLY_SAVES:
            writer_seconds = writer_cost() if writer_cost else None
            measured = self._measure(now, writer_seconds)
            if measured is not None and measured[0] > EARLY_FACTOR * self.fraction:
                self._decide(now, writer_seconds)
                return
        window.saves += 1
        window.heavy += kind == HEAVY

    def _measure(self, now: float, writer_seconds: float | None) -> tuple[float, float] | None:
        """The open window's (share, light share) of training time; None before enough unsaved
        steps were timed to know a step's time."""
        window = self._window
        assert window is not None
        if len(self._step_seconds) < 3 or not self._gaps:
            return None
        step = statistics.median(self._step_seconds)
        added = max(0.0, sum(span - steps * step for span, steps, _ in window.spans))
        light_added = max(0.0, sum(span - steps * step for span, steps, kind in window.spans if kind == LIGHT))
        if writer_seconds is not None and window.writer_seconds is not None:
            writer = max(0.0, writer_seconds - window.writer_seconds)
            added += writer
            # the writer's time by number of steps written: a light step costs it files, not bytes
            light_added += writer * (window.saves - window.heavy - 1) / window.saves
        training = now - window.started - added
        share = added / training if training > 0 else math.inf
        light_share = light_added / training if training > 0 else math.inf
        return share, light_share

    def _decide(self, now: float, writer_seconds: float | None) -> None:
        measured = self._measure(now, writer_seconds)
        self._window = _Window(now, writer_seconds)
        if measured is None:
            return
        share, light_share = measured
        self.last_share = share
        gap = max(1, int(statistics.median(self._gaps)))
        light, heavy = self.light_stride, self.heavy_stride
        if share > self.fraction:
            factor = min(share / self.fraction, 1e6)
            most_heavy = max(1, self.max_interval // (gap * light))
            heavy = min(most_heavy, max(heavy + 1, math.ceil(heavy * factor)))
            left = self.heavy_stride * factor / heavy  # what the heavy stride could not absorb
            if heavy == most_heavy and left > 1.05 and light_share > self.fraction / 2:
                most_light = max(1, self.max_light_interval // gap)
                light = min(most_light, max(light + 1, math.ceil(light * left)))
                heavy = max(1, self.max_interval // (gap * light))
        elif share < self.fraction / 2.5:
            if light > 1:
                light = max(1, light // 2)
                heavy = max(1, self.max_interval // (gap * light))
            elif heavy > 1:
                heavy = max(1, heavy // 2)
        if (light, heavy) == (self.light_stride, self.heavy_stride):
            return
        logger.log(
            logging.INFO if not self.thinning else logging.DEBUG,
            "trainguard: saving took %.1f%% of training time (budget %.0f%%): now saving losses and scalars "
            "every %d steps, weights, gradients and outputs every %d; an explicit save interval keeps the schedule",
            100 * share if math.isfinite(share) else 100.0,
            100 * self.fraction,
            light * gap,
            light * heavy * gap,
        )
        self.light_stride, self.heavy_stride = light, heavy
        self._candidates = 0


class _Window:
    """What one measuring window has seen."""

    __slots__ = ("heavy", "saves", "spans", "started", "writer_seconds")

    def __init__(self, started: float, writer_seconds: float | None) -> None:
        self.started = started
        self.writer_seconds = writer_seconds
        self.saves = 1  # the save that opens it
        self.heavy = 0
        self.spans: list[tuple[float, int, int]] = []  # (seconds, steps, kind of its first step)
