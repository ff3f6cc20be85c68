"""Per-step timings of a PyTorch training loop through public hooks only.

What is watched (installed by :meth:`TorchStepProfiler.install`, removed by :meth:`close`):

* ``DataLoader.__iter__`` is wrapped so the iterator it returns times each ``__next__``;
* every module forward (``register_module_forward_pre_hook`` / ``register_module_forward_hook``):
  a forward starting while no other module runs is a root forward; loss modules don't count;
* ``Tensor.backward`` is wrapped (``loss.backward()``; ``torch.autograd.backward`` called
  directly is not seen, its time lands in "other");
* every optimizer step (``register_optimizer_step_pre_hook`` / ``..._post_hook``).

A step is: [end of previous step, or first data fetch] → data → forward(s) → backward →
optimizer step(s). A TRAIN step closes at the next data fetch or root forward after its
backward or optimizer step (so two optimizers in one loop iteration make one step, and with
gradient accumulation each micro-batch is a step); an EVAL step (no grad, or the root module
in eval mode) closes at the next fetch or root forward. Without a DataLoader, "data" is the gap
between the previous step's end and the next forward.

Each closed step becomes a ``Step:ModeKeys.<MODE>`` event whose args carry ``step_num``,
``data_us``, ``forward_us``, ``backward_us``, ``optimizer_us`` and ``dataloader_workers``; the
phases are also written as their own events for viewing in a trace viewer.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from trainguard.hooks.fail_open import fail_open, log_disabled
from trainguard.hooks.pytorch import is_loss_module
from trainguard.hooks.torch_global_hooks import register_global_forward_hook, register_global_forward_pre_hook
from trainguard.profiler.timeline import TimelineWriter

__all__ = ["TorchStepProfiler"]


class _Step:
    __slots__ = (
        "mode",
        "start",
        "forward_start",
        "last_end",
        "data",
        "forward",
        "backward",
        "optimizer",
        "optimized",
        "workers",
    )

    def __init__(self, mode: str, start: float, forward_start: float, workers: int | None) -> None:
        self.mode = mode
        self.start = start
        self.forward_start = forward_start
        self.last_end = forward_start
        self.data = forward_start - start
        self.forward = self.backward = self.optimizer = 0.0
        self.optimized = False
        self.workers = workers

    @property
    def complete(self) -> bool:
        """The next fetch or root forward starts a new step: after an optimizer step or a
        backward (loops without torch.optim, gradient accumulation: one step per backward), and
        for EVAL after every forward."""
        return self.optimized or self.backward > 0 or self.mode != "TRAIN"


class _TimedIterator:
    """A DataLoader iterator that reports how long each batch took to arrive."""

    def __init__(self, iterator: Any, profiler: TorchStepProfiler, workers: int) -> None:
        self._iterator = iterator
        self._profiler = profiler
        self._workers = workers

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        start = time.time()
        self._profiler._fetch_begin(start)
        try:
            return next(self._iterator)
        except StopIteration:
            self._profiler._epoch_end()
            raise
        finally:
            self._profiler._fetch_end(start, time.time(), self._workers)

    def __len__(self) -> int:
        return len(self._iterator)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterator, name)


class TorchStepProfiler:
    """Turns hook callbacks into per-step events on a :class:`TimelineWriter`."""

    def __init__(self, timeline: TimelineWriter) -> None:
        self.timeline = timeline
        self.enabled = True
        self._handles: list[Any] = []
        self._originals: list[tuple[Any, str, Any]] = []
        self._depth = 0
        self._root_start = 0.0
        self._optimizer_start = 0.0
        self._step: _Step | None = None
        self._pending_data_start: float | None = None
        self._last_step_end: float | None = None
        self._workers: int | None = None
        self._counters: dict[str, int] = {}
        self._global_step = 0

    # -- installing -------------------------------------------------------------------------
    def install(self) -> TorchStepProfiler:
        self._handles.append(register_global_forward_pre_hook(self._pre_forward))
        self._handles.append(register_global_forward_hook(self._post_forward, always_call=True))
        self._handles.append(register_optimizer_step_pre_hook(self._pre_optimizer))
        self._handles.append(register_optimizer_step_post_hook(self._post_optimizer))
        self._wrap(torch.Tensor, "backward", self._backward_wrapper(torch.Tensor.backward))
        self._wrap(torch.utils.data.DataLoader, "__iter__", self._iter_wrapper(torch.utils.data.DataLoader.__iter__))
        return self

    def _wrap(self, owner: Any, name: str, replacement: Any) -> None:
        self._originals.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, replacement)

    def disable(self, reason: BaseException | str) -> None:
        if self.enabled:
            self.enabled = False
            log_disabled("the framework profiler", reason)

    def close(self) -> None:
        """Write the step still open, remove every hook and wrapper."""
        self.close_open_step()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)
        self._originals.clear()
        self.enabled = False

    @fail_open
    def close_open_step(self) -> None:
        """Record the step in progress now (training is over: no forward will close it)."""
        if self.enabled and self._step is not None:
            self._close_step()

    # -- data -------------------------------------------------------------------------------
    def _iter_wrapper(self, original: Any) -> Any:
        profiler = self

        @functools.wraps(original)
        def __iter__(loader: Any) -> Any:
            iterator = original(loader)
            if not profiler.enabled:
                return iterator
            return _TimedIterator(iterator, profiler, int(getattr(loader, "num_workers", 0) or 0))

        return __iter__

    @fail_open
    def _fetch_begin(self, now: float) -> None:
        if self._step is not None and self._step.complete:
            self._close_step()
        if self._pending_data_start is None:
            self._pending_data_start = now

    @fail_open
    def _fetch_end(self, start: float, end: float, workers: int) -> None:
        self._workers = workers
        self.timeline.record("DataLoader:__next__", "DataLoader", start, end, {"num_workers": workers})

    @fail_open
    def _epoch_end(self) -> None:
        # The next epoch's first step starts at its own first fetch, not at this epoch's end.
        self._pending_data_start = None
        self._last_step_end = None

    # -- forward ----------------------------------------------------------------------------
    @fail_open
    def _pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        self._depth += 1
        if self._depth != 1 or is_loss_module(module):
            return
        now = time.time()
        mode = "TRAIN" if module.training and torch.is_grad_enabled() else "EVAL"
        step = self._step
        if step is not None and (step.complete or mode != step.mode):
            self._close_step()
            step = None
        if step is None:
            start = self._last_step_end or self._pending_data_start or now
            self._step = _Step(mode, min(start, now), now, self._workers if self._pending_data_start else None)
            self._pending_data_start = None
        self._root_start = now

    @fail_open
    def _post_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth or is_loss_module(module) or self._step is None or not self._root_start:
            return
        now = time.time()
        self._step.forward += now - self._root_start
        self._step.last_end = now
        self.timeline.record("Forward", "Forward", self._root_start, now, {"step_num": self._current_number()})
        self._root_start = 0.0

    # -- backward and optimizer ---------------------------------------------------------------
    def _backward_wrapper(self, original: Any) -> Any:
        profiler = self

        @functools.wraps(original)
        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            start = time.time()
            try:
                return original(tensor, *args, **kwargs)
            finally:
                profiler._backward_done(start, time.time())

        return backward

    @fail_open
    def _backward_done(self, start: float, end: float) -> None:
        if self._step is None:
            return
        self._step.backward += end - start
        self._step.last_end = end
        self.timeline.record("Backward", "Backward", start, end, {"step_num": self._current_number()})

    @fail_open
    def _pre_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._optimizer_start = time.time()

    @fail_open
    def _post_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._step is None or not self._optimizer_start:
            return
        now = time.time()
        self._step.optimizer += now - self._optimizer_start
        self._step.optimized = True
        self._step.last_end = now
        self.timeline.record("Optimizer", "Optimizer", self._optimizer_start, now, {"step_num": self._current_number()})
        self._optimizer_start = 0.0

    # -- steps ------------------------------------------------------------------------------
    def _current_number(self) -> int:
        return self._counters.get(self._step.mode, 0) if self._step else -1

    def _close_step(self) -> None:
        step, self._step = self._step, None
        if step is None:
            return
        number = self._counters.get(step.mode, 0)
        self._counters[step.mode] = number + 1
        end = max(step.last_end, step.forward_start)
        args: dict[str, Any] = {
            "step_num": number,
            "global_step": self._global_step,
            "data_us": int(step.data * 1e6),
            "forward_us": int(step.forward * 1e6),
            "backward_us": int(step.backward * 1e6),
            "optimizer_us": int(step.optimizer * 1e6),
        }
        if step.workers is not None:
            args["dataloader_workers"] = step.workers
        self._global_step += 1
        self.timeline.record(f"Step:ModeKeys.{step.mode}", f"Step:ModeKeys.{step.mode}", step.start, end, args)
        self._last_step_end = end
