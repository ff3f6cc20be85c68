"""Validation passes the loss rules may compare: whole passes (or the same first batches of each).

Overfit and Overtraining compare one value per validation pass, the mean of its saved losses. A
mean over *different batches* is no comparison: saved every 10th EVAL step, an 8-batch pass keeps
one batch at a different position each time, and a healthy run whose mean validation loss falls
from 0.18 to 0.07 can look like a rising one. So a pass is compared only when its saved losses are
known to be the whole pass, or the same first ``n`` batches as every other pass compared.

Passes from step numbers alone. The hook counts its global step in every mode, so for EVAL steps
``global step - mode step`` is constant within one pass and changes when a step of another mode ran
between (:attr:`EvalPass.offset`). A TRAIN step ``(g, m)`` says how many steps of other modes ran
before it (``g - m``: the EVAL steps so far, when the run has no PREDICT steps), and a pass's first
EVAL mode step says how many EVAL steps ran before it. From those:

* a pass's *start is known* when its first saved EVAL mode step equals the number of EVAL steps
  run before it (the first pass starting at EVAL step 0; a pass right after a whole one), or when
  the writer declares that it saves the first steps of every pass (trainguard's hook:
  ``eval_pass_steps`` in the collections file's ``_meta``, see trainguard.hooks.eval_passes);
* a pass is *whole* when its start is known, its saved steps are consecutive and the EVAL count
  learnt next (from the next TRAIN step or the next pass) is one past its last saved step. The
  last pass of a finished run, with nothing after it, counts as whole when its start is known and
  its steps are consecutive (and, for a declaring writer, fewer than its bound: else they may be a
  longer pass's first batches).

A pass is comparable when it is whole (value: all its steps), or when the writer declared
``eval_pass_steps = n`` and the pass holds its first ``n`` steps (a longer pass: value over those
``n``). Passes are compared only with passes of the same kind (whole, or the first ``n``).
Everything else (one batch of each pass, a pass whose start is unknown) is skipped and counted,
and a rule that saw validation passes but could compare none says so ("not evaluated").

Limits: a shuffled validation loader puts other batches first each pass, so bounded prefixes then
hold different batches (whole passes do not have this problem); a script that evaluates a random
single batch per pass gives passes of one step, whole by this definition, and the rules' noise
estimate is all that stands between that noise and a finding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainguard.errors import StorageError
from trainguard.modes import ModeKeys

__all__ = ["EvalPass", "PassSplitter", "ValidationPasses", "declared_eval_pass_steps", "not_comparable_reason"]


@dataclass
class EvalPass:
    """The saved loss steps of one validation pass."""

    offset: int  # global step - EVAL mode step, the same for every step of the pass
    steps: list[int] = field(default_factory=list)  # global steps, ascending
    mode_steps: list[int] = field(default_factory=list)
    start_known: bool = False
    whole: bool | None = None  # None: not known yet (nothing told the EVAL count after it)
    compared: list[int] = field(default_factory=list)  # the steps its value is the mean of
    kind: str = ""  # "whole" or "first <n>"; "" when it is not comparable
    why_not: str = ""

    @property
    def first(self) -> int:
        return self.steps[0]

    @property
    def last(self) -> int:
        return self.steps[-1]

    def consecutive(self) -> int:
        """How many of the saved steps, from the first, have consecutive mode steps."""
        count = 1
        while count < len(self.mode_steps) and self.mode_steps[count] == self.mode_steps[count - 1] + 1:
            count += 1
        return count


def declared_eval_pass_steps(trial: Any) -> int | None:
    """The ``eval_pass_steps`` a run's writer declared (the first that many EVAL steps of every
    pass hold its losses), or None: read from the collections files' ``_meta``."""
    from trainguard.config.collections import CollectionManager
    from trainguard.format.layout import COLLECTIONS_PREFIX, is_collections_key

    store = getattr(trial, "store", None)
    if store is None:
        return None
    try:
        keys = [key for key in store.list(COLLECTIONS_PREFIX) if is_collections_key(key)]
        found = [CollectionManager.meta_of(store.read(key)).get("eval_pass_steps") for key in keys]
    except (StorageError, OSError, ValueError):
        return None
    limits = [value for value in found if isinstance(value, int) and not isinstance(value, bool) and value > 0]
    return min(limits) if limits and len(limits) == len(found) else None


class PassSplitter:
    """Splits a run's saved loss steps, fed in order, into validation passes and judges each one.

    :meth:`add` takes every saved loss step (any mode) in ascending global-step order;
    :meth:`ready` hands out each pass once its comparability is decided (``final``: the run
    ended, decide the last one too). O(1) per step.
    """

    def __init__(self, declared: int | None) -> None:
        self.declared = declared
        self.passes: list[EvalPass] = []
        # the EVAL mode step the next pass starts at, when the steps tell (the first pass: 0)
        self._expected_start: int | None = 0
        self._handed = 0
        self.kind: str | None = None  # the kind of the first comparable pass: the others must match

    def add(self, step: int, mode: ModeKeys | None, mode_step: int) -> None:
        current = self.passes[-1] if self.passes else None
        if mode is ModeKeys.EVAL:
            offset = step - mode_step
            if current is not None and current.offset == offset:
                current.steps.append(step)
                current.mode_steps.append(mode_step)
                return
            if current is not None and self._close(current, mode_step):
                self._expected_start = mode_step  # right after a whole pass: this one's start
            start_known = self.declared is not None or mode_step == self._expected_start
            self._expected_start = None  # learnt again from the steps after this pass
            self.passes.append(EvalPass(offset, [step], [mode_step], start_known=start_known))
        elif mode is ModeKeys.TRAIN:
            count = step - mode_step  # the steps of other modes before it: EVAL steps, without PREDICT
            if current is not None:
                self._close(current, count)
            self._expected_start = count
        else:
            self._expected_start = None  # PREDICT/GLOBAL steps: the EVAL count is no longer known

    @staticmethod
    def _close(current: EvalPass, eval_count: int) -> bool:
        """Whether ``current`` is whole, now that ``eval_count`` EVAL steps are known to have run."""
        if current.whole is None:
            current.whole = (current.start_known and current.consecutive() == len(current.steps)
                             and eval_count == current.mode_steps[-1] + 1)  # fmt: skip
        return current.whole

    def ready(self, final: bool) -> list[EvalPass]:
        """Passes decided since the last call, in order, each with ``kind`` and ``compared`` set
        (or ``why_not``)."""
        found: list[EvalPass] = []
        while self._handed < len(self.passes):
            candidate = self.passes[self._handed]
            last = self._handed + 1 == len(self.passes)
            if candidate.whole is None:
                if not final:
                    break  # still open, or nothing after it told whether it is whole
                # the last pass of a finished run: whole when nothing says otherwise, but a declared
                # writer's bound reached may be a longer pass's first batches
                candidate.whole = (candidate.start_known and candidate.consecutive() == len(candidate.steps)
                                   and (self.declared is None or len(candidate.steps) < self.declared))  # fmt: skip
            self._decide(candidate)
            found.append(candidate)
            self._handed += 1
            if last:
                break
        return found

    def _decide(self, candidate: EvalPass) -> None:
        if candidate.whole:
            kind, compared = "whole", list(candidate.steps)
        elif candidate.start_known and self.declared is not None and candidate.consecutive() >= self.declared:
            kind, compared = f"first {self.declared}", candidate.steps[: self.declared]
        else:
            candidate.why_not = (
                "not the whole pass" if candidate.start_known else "its first saved step is not its first batch"
            )
            return
        if self.kind is None:
            self.kind = kind
        if kind != self.kind:
            candidate.why_not = f"{kind} batches saved, the passes compared hold {self.kind}"
            return
        candidate.kind, candidate.compared = kind, compared

    def skipped(self) -> int:
        return sum(1 for candidate in self.passes[: self._handed] if not candidate.kind)


def not_comparable_reason(splitter: PassSplitter) -> str:
    """Why a run with validation passes had none to compare (for "not evaluated")."""
    examples = [candidate for candidate in splitter.passes if candidate.why_not][:3]
    shown = "; ".join(
        f"pass at step {candidate.first} ({len(candidate.steps)} saved step(s)): {candidate.why_not}"
        for candidate in examples
    )
    return (
        f"the saved EVAL steps are not whole validation passes ({shown}): one batch of each pass (every Nth EVAL "
        "step saved) compares different batches, not the validation loss; save every EVAL step of a pass "
        "(trainguard's hook saves the losses of the first TRAINGUARD_EVAL_PASS_STEPS steps of each pass, default "
        "64), e.g. SaveConfig(mode_save_configs={modes.EVAL: SaveConfigMode(save_interval=1)})"
    )


class ValidationPasses:
    """A rule's view of a run's validation passes: new passes, decided, as the run grows."""

    def __init__(self, history: Any) -> None:
        self.history = history  # a LossHistory
        self.splitter: PassSplitter | None = None
        self._entries = 0  # loss steps fed to the splitter

    def new(self, upto: int | None, *, final: bool) -> list[EvalPass]:
        """Passes decided since the last call, from the loss steps up to global ``upto``."""
        splitter = self.splitter
        if splitter is None:  # read once: the writer's declaration does not change during a run
            splitter = self.splitter = PassSplitter(declared_eval_pass_steps(self.history.trial))
        for step, mode, mode_step in self.history.entries(self._entries):
            if upto is not None and step > upto:
                break
            self._entries += 1
            splitter.add(step, mode, mode_step)
        return splitter.ready(final)

    def seen_any(self) -> bool:
        return self.splitter is not None and bool(self.splitter.passes)

    def reason(self) -> str:
        return not_comparable_reason(self.splitter) if self.splitter is not None else ""
