"""The per-step sentinel: a non-finite gradient at a step the schedule does not save is still saved.

The save schedule saves every ``save_interval``-th step; between saves the PyTorch hook runs
almost nothing (quiet_run.py), so a loss that turned NaN at step 57 of a run saved every 10 steps
used to show only at step 60, as NaN weights whose origin is gone, and a run of fewer optimizer
steps than the interval (5 LBFGS steps) saved step 0 only and never showed it at all.

What it watches: at every optimizer step of a run of unsaved steps, the gradient the optimizer
applies to one parameter near the loss (the last parameter it steps with at most ``SMALL``
elements: usually the output layer's bias). A NaN/inf loss makes every gradient on its path
non-finite, that one included; so does a non-finite gradient of a finite loss (the other case
the sentinel is for). What it costs: the optimizer ends an unsaved step through C callables
(torch_optimizer.py), and those now also append a reference to that ``.grad`` to a list: no
Python frame, no torch call, no device synchronisation on the step. The references are read in
one batch when the run of unsaved steps ends (the next step takes the general path: at most
every ``save_interval`` steps, and at close): one ``torch.stack`` and one read-back (on an
accelerator, one synchronisation) per run. ``zero_grad()`` makes a new gradient tensor each
step (``set_to_none=True``, PyTorch's default), so each reference keeps its step's values.

What it does: the first step whose gradient is non-finite (after finite ones) is written as a saved TRAIN
step of its own, at its own number, holding that gradient under its usual name
(``gradient/<model>_<parameter>``), before any later step is written. ExplodingTensor then finds
the NaN at its step in a run of any length, and ``--stop-on-issue`` stops on it; the loss rules
see the NaN loss at the next saved step.

Steps are counted as the hook counts them: an optimizer-driven TRAIN step ends with
``optimizer.step()``, except that each evaluation of an LBFGS closure after an inner update is a
step of its own (closure_steps.py); there every evaluation takes the general path, which arms the
sentinel for that one step (``run_begins(step, mode_step, 0)``), and the gradient judged is the
one the optimizer step ends with, the last evaluation's (a NaN stays: it is dated to the last
evaluation of the optimizer step it appeared in). Not seen: a loss that is infinite while
its gradients stay finite (cross-entropy of a ``-inf`` logit); a NaN that first appears in the
forward of a step that never reaches backward, the script dying there (a VAE at a far too high
learning rate: finite loss 5.5e10 and finite gradients at step 1, weights still finite after its
update, then NaN probabilities at step 2 that ``BCELoss`` refuses with an error): no gradient
holds it, and nothing of an unsaved step's forward is kept; gradients zeroed in place
(``zero_grad(set_to_none=False)``: the references are one tensor, so only the run's last step is
judged, and a NaN is dated there); loops without an optimizer (a hand-written update: every step
takes the general path, and a NaN shows at the next saved step, as before). Skipped steps of
mixed precision never reach ``optimizer.step()`` (GradScaler skips them), so their infinite
gradients, which are normal there, raise nothing. Finite values are not written: the loss rules'
windows are calibrated on losses spaced by the save interval, and a run of a few steps has too
few values for a trend; the sentinel makes short runs not blind to NaN, not judged for trends.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from trainguard.modes import ModeKeys

if TYPE_CHECKING:
    from trainguard.hooks.quiet_run import QuietRun

__all__ = ["SMALL", "StepSentinel"]

logger = logging.getLogger("trainguard")

# The watched parameter's most elements: the batch read stacks one copy of it per step
SMALL = 4096


class StepSentinel:
    """Sees one gradient per optimizer step; writes a step whose gradient is non-finite.

    The hook holds one. :meth:`watch` picks an optimizer's watched parameter, :meth:`run_begins`
    is told when a run of unsaved steps is counted; during the run the optimizer's step appends
    ``(gradient, quiet.left, quiet.removed, name)`` to :attr:`entries` (the C callables of
    torch_optimizer.py, or the post-hook's usual path); :meth:`step_ended` reads them where no
    step of the writer is open. ``hook`` gives ``enabled`` and ``_ensure_writer`` (BaseHook's)."""

    def __init__(self, hook: Any, quiet: QuietRun) -> None:
        self._hook = hook
        self._quiet = quiet
        self.entries: list[tuple[Any, int, int, str]] = []  # never replaced: C callables hold it
        self.armed = False  # a run of unsaved steps is being counted
        # id(optimizer) -> its watched parameter and that one's gradient name
        self.watched: dict[int, tuple[torch.Tensor, str]] = {}
        self._base: tuple[int, int, int] = (0, 0, 0)  # (step, TRAIN mode step, steps of the run)
        self._written = -1  # the last step this wrote
        self._failing = False  # the last gradient judged was non-finite (a NaN stays: written once)
        self.on = True
        self.found: list[tuple[int, str]] = []  # (step, tensor name) of the steps written

    def watch(self, optimizer: Any, gradient_names: dict[int, str]) -> None:
        """Pick ``optimizer``'s watched parameter among those with a gradient name (id -> name)."""
        if not self.on:
            return
        try:
            parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]
                          if isinstance(parameter, torch.Tensor) and id(parameter) in gradient_names]  # fmt: skip
            if not parameters:
                return
            small = [parameter for parameter in parameters if parameter.numel() <= SMALL]
            chosen = small[-1] if small else min(parameters, key=lambda parameter: parameter.numel())
            self.watched[id(optimizer)] = (chosen, gradient_names[id(chosen)])
        except Exception:  # noqa: BLE001 - fail open: an optimizer without the usual groups
            logger.debug("trainguard: the step sentinel cannot watch this optimizer", exc_info=True)

    def run_begins(self, step: int, mode_step: int, steps: int) -> None:
        """A run of ``steps`` unsaved TRAIN steps follows ``step`` (itself unsaved, its first)."""
        if not self.on:
            return
        self._flush(None)
        self._base = (step, mode_step, steps)
        self.armed = True

    def step_ended(self, before: int | None = None) -> None:
        """The hook's step ended (the general path), or the current one is about to be saved
        after all (``before``: its number, not written here): the run's gradients are read."""
        self.armed = False
        self._flush(before)

    def close(self) -> None:
        self.on = False
        self.armed = False
        self.entries.clear()
        self.watched.clear()

    # -- reading --------------------------------------------------------------------------------
    def _flush(self, before: int | None) -> None:
        entries = self.entries
        if not entries:
            return
        batch = entries[:]
        entries.clear()
        try:
            self._check(batch, before)
        except Exception as error:  # noqa: BLE001 - fail open: training goes on without the sentinel
            logger.debug("trainguard: the step sentinel stopped: %s", error, exc_info=True)
            self.close()

    def _check(self, batch: list[tuple[Any, int, int, str]], before: int | None) -> None:
        try:  # the usual run: one gradient tensor of one shape per step, all finite
            with torch.no_grad():
                if bool(torch.isfinite(torch.stack([entry[0] for entry in batch])).all()):
                    self._failing = False
                    return
        except (TypeError, RuntimeError):  # a step without a gradient, several shapes: one by one
            pass
        gradients: list[Any] = []
        where: list[Any] = []
        for gradient, left, removed, name in batch:
            # (one shape: with several optimizers, the first one's parameter is judged)
            if isinstance(gradient, torch.Tensor) and (not gradients or gradient.shape == gradients[0].shape):
                gradients.append(gradient)
                where.append((*self._resolve(left, removed), name))
        if not gradients:
            return
        with torch.no_grad():
            stacked = torch.stack(gradients).reshape(len(gradients), -1)
            finite = torch.isfinite(stacked).all(dim=1).tolist()  # one read-back per run
        for index, ok in enumerate(finite):
            step, mode_step, name = where[index]
            if before is not None and step >= before:
                return
            if ok:
                self._failing = False
            elif not self._failing and step > self._written:
                self._failing = True  # the first one is the finding; the later steps show it too
                self._write(step, mode_step, name, gradients[index])

    def _resolve(self, left: int, removed: int) -> tuple[int, int]:
        step, mode_step, steps = self._base
        index = steps - removed - left  # 0: the run's first step (QuietRun.removed says why)
        return step + index, mode_step + index

    def _write(self, step: int, mode_step: int, name: str, gradient: torch.Tensor) -> None:
        hook = self._hook
        if not hook.enabled:
            return
        writer = hook._ensure_writer()
        if writer is None:
            return
        array = gradient.detach().to("cpu", copy=True).numpy()
        writer.begin_step(step, ModeKeys.TRAIN, mode_step)
        writer.add_tensor(name, array, nbytes=array.nbytes)
        writer.end_step()
        self._written = step
        self.found.append((step, name))
        logger.info("trainguard: %s was not finite at step %d (not a scheduled save): saved that step", name, step)
