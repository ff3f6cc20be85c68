"""``torch.compile``d models: capture without breaking the compiled graph.

A module hook that Dynamo sees while it traces a model is either traced into the graph (it
cannot trace the hook's bookkeeping: locks, files, weak references) or, wrapped in
``torch.compiler.disable``, splits the graph around it: one break per submodule per step. And
Dynamo does not guard on module hooks, so a graph traced *with* hooks keeps calling them on
every later step, and one traced *without* them never calls hooks added later.

So the hook never lets Dynamo see a hook of ours:

* the step is driven from the ``OptimizedModule`` wrapper that ``torch.compile(model)``
  returns, whose own call runs in Python *before* Dynamo starts on the wrapped model: a call
  shim there (torch_root_call.py; a pre-hook where its slot is taken) costs one Python call and
  no graph break, and keeps the wrapper's call on ``Module.__call__``'s fast path;
* on a step that saves nothing, the wrapped model carries no hook of ours: Dynamo traces (and
  later runs) the clean graph;
* on a saved step the wrapper's pre-hook sets ``torch.compiler.set_stance("force_eager")`` for
  that one forward: the model runs as plain eager PyTorch with the saved step's module hooks,
  which gives exactly the eager tensor names and values, and no graph is traced with our hooks
  in it. The wrapper's post-hook restores the stance.

Parameters and gradients need no graph presence: weights are read when a step begins and
gradients from ``.grad`` through post-accumulate-grad hooks (autograd, outside Dynamo).
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import torch

__all__ = ["ForcedEager", "find_compile_wrapper", "in_compile_wrapper", "is_compile_wrapper"]


def is_compile_wrapper(module: Any) -> bool:
    """``torch.compile(model)``'s ``OptimizedModule`` (by name: no import of torch._dynamo)."""
    return type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod")


def in_compile_wrapper() -> bool:
    """Whether an ``OptimizedModule`` call is under way (a cheap flag read, for every step).

    ``torch._dynamo`` is only imported once something was compiled: until then, nothing is.
    """
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None:
        return False
    probe = getattr(eval_frame, "_is_in_optimized_module", None)
    return bool(probe()) if probe is not None else False


def find_compile_wrapper(module: torch.nn.Module, max_depth: int = 60) -> torch.nn.Module | None:
    """The ``OptimizedModule`` whose call is running ``module`` (found once, from the stack).

    Only needed when a model registered eagerly is compiled later: a model compiled before
    its first forward is seen at the wrapper itself.
    """
    frame: FrameType | None = sys._getframe(1)
    depth = 0
    while frame is not None and depth < max_depth:
        candidate = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        if is_compile_wrapper(candidate) and candidate._orig_mod is module:  # type: ignore[union-attr]
            return candidate
        frame = frame.f_back
        depth += 1
    return None


class ForcedEager:
    """``torch.compiler.set_stance("force_eager")`` from :meth:`enter` until :meth:`leave`.

    Entered in a wrapper's pre-hook (outside any compiled region: set_stance refuses to run
    inside one) and left in its post-hook, or at the next step's pre-hook if the forward raised.
    """

    def __init__(self) -> None:
        self._stance: Any = None
        self.available = hasattr(torch.compiler, "set_stance")  # torch >= 2.6

    @property
    def active(self) -> bool:
        return self._stance is not None

    def enter(self) -> bool:
        if not self.available:
            return False
        if self._stance is None:
            self._stance = torch.compiler.set_stance("force_eager")  # effective at once
        return True

    def leave(self) -> None:
        stance, self._stance = self._stance, None
        if stance is not None:
            stance.__exit__(None, None, None)  # back to the stance that was set before
