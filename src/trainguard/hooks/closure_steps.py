"""Closure evaluations as steps: an optimizer that updates the parameters between evaluations of
its closure, inside one ``optimizer.step(closure)`` (LBFGS: up to ``max_iter`` forward and backward
passes, each at parameters its previous iteration changed).

A TRAIN step ends with ``optimizer.step()`` (torch_optimizer.py), so that the micro-batches of
gradient accumulation are one step. Counted that way, an LBFGS run of 10 steps is 10 steps: at a
save interval of 5, two saved steps, too few for any rule that compares saved steps (a learning
rate of 0 leaves the weights unchanged, and nothing can say so). Each closure evaluation after an
inner update is an iteration of training in every sense the rules read (new weights, their loss,
their gradient): it is counted as a step, as smdebug counts every forward.

Told apart from accumulation by the parameters: a root forward that finds the parameter it watches
changed in place since the previous forward of the same step, with no optimizer step ended in
between, follows an update (micro-batches of one accumulation window see the same parameters).
Once seen, the run counts this way (:attr:`ClosureSteps.active`) and its steps take the general
path: a forward on the unsaved steps' fast path records nothing to compare with, and each
evaluation is a full forward and backward, whose cost dwarfs the general path's. Gradients of a
saved evaluation are held as autograd accumulates them: the next evaluation's ``zero_grad()``
drops them before its forward ends the step.
"""

from __future__ import annotations

import weakref

import torch

__all__ = ["ClosureSteps"]


class ClosureSteps:
    """The watched parameter's version at the last root forward of the current step."""

    __slots__ = ("active", "_mark", "_watched")

    def __init__(self) -> None:
        self.active = False  # an update between two forwards of one step was seen: closure steps
        self._mark: tuple[int, weakref.ref[torch.Tensor], int] | None = None  # (step, parameter, version)
        # root -> the parameter it is watched by (its first trainable one)
        self._watched: weakref.WeakKeyDictionary[torch.nn.Module, weakref.ref[torch.Tensor]] = (
            weakref.WeakKeyDictionary()
        )

    def updated_within(self, step: int) -> bool:
        """Whether the parameters changed since the last forward of ``step``, the open TRAIN step
        (the caller asks only then): that forward's evaluation is a finished step, and an update
        followed it. (A step that ended, by an optimizer step or a mode change, is not asked.)"""
        mark = self._mark
        if mark is None or mark[0] != step:
            return False
        parameter = mark[1]()
        if parameter is None or parameter._version == mark[2]:
            return False
        self.active = True
        return True

    def note(self, module: torch.nn.Module, step: int) -> None:
        """A root forward of TRAIN ``step`` runs now."""
        reference = self._watched.get(module)
        parameter = reference() if reference is not None else None
        if parameter is None:
            parameter = next((p for p in module.parameters() if p.requires_grad), None)
            if parameter is None:
                self._mark = None
                return
            self._watched[module] = weakref.ref(parameter)
        self._mark = (step, weakref.ref(parameter), parameter._version)
