"""The PyTorch hook's step driver: where every training step enters trainguard, and the unsaved
step's fast path.

A step begins at a registered root's call. The usual step saves nothing (the schedule's next
save is steps away), and on it trainguard runs one Python function: the root's call shim
(:meth:`StepDriver._call_shim`), which counts the step down in the hook's :class:`QuietRun` and
passes the call on. Every other step takes the general path (``TorchHook.root_forward``).

Why the fast path looks as it does:

* no module hook on the root: any forward hook sends each call of the module down
  ``Module._call_impl``'s slow path (a closure, a set and tuples of hooks built per call). The
  shim sits in the module's own ``_compiled_call_impl`` instead (torch_root_call.py), and the
  module's ``_call_impl`` keeps its fast path;
* the check reads the few slots of one small object (QuietRun), not the hook's: between two
  calls of the shim, the step's tensors and PyTorch's own code push trainguard's objects out of
  the CPU's caches, and each object read costs a cache line;
* the check is written out in the shim, not called: a call of ours inside a training step costs
  far more than it does alone;
* nothing is re-checked that cannot change unseen: whatever the run was counted under ends the
  run where it changes (QuietRun.end), and the step counters are brought up to date when read
  (CountsQuietSteps), not written at each step;
* a ``torch.compile``d model's steps are driven from its ``OptimizedModule`` wrapper, outside the
  compiled region, so that Dynamo never traces a hook of ours (torch_compiled.py); a saved step
  runs the model eagerly under ``torch.compiler.set_stance("force_eager")``.

The optimizer's side of the same path (the step's end) is in torch_optimizer.py.

Private PyTorch slots the driver and its helpers rely on, tested with torch 2.13.0 (each use has a
fallback to public hooks where the slot is missing or taken):

* ``torch.nn.Module._compiled_call_impl``: the call shim's place (torch_root_call.py);
* ``torch._dynamo.eval_frame._is_in_optimized_module`` and ``OptimizedModule._orig_mod``: whether
  a compiled wrapper's call is under way, and the model it wraps (torch_compiled.py);
* ``torch._dynamo.decorators.skip``: Dynamo skips the pre-hook's two functions (:func:`skip_in_dynamo`);
* ``torch.optim.Optimizer._optimizer_step_code`` and ``RemovableHandle.hooks_dict_ref()``: a run
  of unsaved steps ends steps without a Python call (torch_optimizer.py);
* ``torch._C._autograd._profiler_enabled``: not while PyTorch's profiler watches that method.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch

from trainguard.hooks.fail_open import fail_open
from trainguard.hooks.overhead_budget import QUIET
from trainguard.hooks.quiet_run import QuietRun
from trainguard.hooks.torch_compiled import ForcedEager, find_compile_wrapper, in_compile_wrapper, is_compile_wrapper
from trainguard.hooks.torch_global_hooks import register_global_forward_pre_hook
from trainguard.hooks.torch_part import CoreSwitch, HookPart
from trainguard.hooks.torch_root_call import RootCall, before_compile, displaced, install_root_call, shims_safe

__all__ = ["DriverCore", "StepDriver", "eager", "skip_in_dynamo"]

logger = logging.getLogger("trainguard")

# The unsaved step's check reads this as a global: ``torch.is_grad_enabled`` is an attribute of
# a module, one lookup more at every execution.
_is_grad_enabled = torch.is_grad_enabled


def eager(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` run as plain Python even inside a ``torch.compile``d model.

    Dynamo never sees our hooks in the usual cases (torch_compiled.py: a compiled model's saved
    steps run eagerly, its unsaved steps carry no hook). This covers the others, e.g. a model
    compiled after its first eager forward, or one called from a compiled training step:
    Dynamo would otherwise trace the hook's bookkeeping (locks, files, weak references), which
    it cannot, and capture would stop; disabled, it breaks the graph around the hook instead.
    """
    return torch.compiler.disable(function, recursive=True)


def skip_in_dynamo(*functions: Callable[..., Any]) -> bool:
    """Mark plain functions (not bound methods) so that Dynamo neither compiles their frames nor
    inlines them (a traced model breaks its graph where it would call one), at no cost per call:
    :func:`eager` wraps with a function that costs about five Python calls, each one more thing an
    unsaved step pays. Frames they call are not covered: such functions may call only C
    functions, each other and :func:`eager` ones. False where this PyTorch has no such marking
    (``torch._dynamo.decorators.skip``, not public): then use :func:`eager`."""
    try:
        from torch._dynamo.decorators import skip
    except ImportError:
        return False
    for function in functions:
        if not getattr(function, "_torchdynamo_disable", False):
            skip(function)
    return True


class DriverCore(CoreSwitch, Protocol):
    """What the driver needs of the hook: its step logic and the few facts a run's end reads."""

    saving_this_step: bool
    step: int
    _budget: Any  # the overhead budget, or None
    _ends_quiet_windows: bool  # whether _before_possibly_saved_step does anything
    _module_io: Any  # the saved steps' module hooks (torch_io_sources.py)

    def root_forward(self, module: torch.nn.Module) -> None: ...

    def _root_pre_forward_general(self, module: torch.nn.Module, args: Any) -> None: ...

    def _release_hooks(self) -> None: ...

    def _stop_signalling(self) -> None: ...

    def _before_possibly_saved_step(self) -> None: ...


class StepDriver(HookPart):
    """How each registered root's (or its compiled wrapper's) calls reach the hook, and the
    unsaved step's check on them."""

    _core: DriverCore

    def __init__(self, core: DriverCore, quiet: QuietRun) -> None:
        super().__init__(core)
        # Shims until something is compiled; none in a process that may have compiled before this
        # hook watched torch.compile (shims_safe). First: what follows imports Dynamo.
        self._root_shims = shims_safe()
        if self._root_shims:
            before_compile(self._roots_before_compile)
        self._quiet = quiet  # the run of unsaved steps, shared with the hook and its call shims
        self.released = False  # per-step hooks removed after capture was disabled
        # id(root) -> its call shim's or pre-hook's handle, while the root itself drives its
        # steps (not a wrapper)
        self.root_hooks: dict[int, Any] = {}
        self.wrapped_roots: set[int] = set()  # roots whose steps begin at their compiled wrapper
        self._wrapper_shims: list[RootCall] = []  # torch.compile wrappers' call shims
        self._wrapper_handles: list[Any] = []  # ...and their pre-hooks, where no shim fits
        self._forced_eager = ForcedEager()
        self._wrapper_post_handle: Any = None
        # Until a registered root first runs: a global pre-hook that spots torch.compile's
        # wrapper around it (then removed, so it costs nothing per step).
        self._watch_handle: Any = None
        # The root's pre-hook: its quiet path (the usual unsaved step) runs no Python of ours but
        # these two functions, which Dynamo skips; the rest goes through eager() ones.
        skipped = skip_in_dynamo(StepDriver._root_pre_forward, StepDriver.quiet_step)
        self._root_pre_hook = self._root_pre_forward if skipped else eager(self._root_pre_forward)
        self._general_root_pre_forward = eager(core._root_pre_forward_general)
        self._eager_end_quiet_window = eager(self._end_quiet_window)

    # -- the unsaved step ---------------------------------------------------------------------
    def _root_pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        # Registered as it is where Dynamo can skip it (skip_in_dynamo), through eager() elsewhere
        if self.released:
            return  # capture was disabled and every other hook taken away: one check per step
        if not self.quiet_step(module):
            self._general_root_pre_forward(module, args)

    def quiet_step(self, module: torch.nn.Module) -> bool:
        """Count the usual unsaved step and say so; False for every other step.

        The usual unsaved step: an optimizer-driven TRAIN step after one that saved nothing,
        whose number the schedule was already asked about (begin_step), with the model in
        training mode and gradients on. The root's pre-hook runs this first, before any other
        call (a few attribute checks, no allocation), and the general path would come to the
        same state. What else the run was counted under (mode, capture enabled, collections,
        no unscheduled save) ends the run where it changes (quiet_run.py). The call shims have
        this written out (:meth:`_call_shim`): change both. A model compiled after it ran
        eagerly is noticed at the next step that takes the general path (torch.compile ends the
        run of unsaved steps: the second step after it).
        """
        quiet = self._quiet
        if not (
            quiet.left
            and quiet.pending
            and len(quiet.collections) == quiet.count
            and module.training
            and _is_grad_enabled()
        ):
            return False
        quiet.left -= 1  # the step counted (CountsQuietSteps adds it to step and mode_steps)
        quiet.pending = False
        if not quiet.left:
            core = self._core
            if core._budget is not None or core._ends_quiet_windows:
                self._eager_end_quiet_window()
        return True

    def _root_call(self, module: torch.nn.Module, call_impl: Callable[..., Any]) -> Callable[..., Any]:
        """The body of a root's call shim (torch_root_call.py): its steps begin at its own call."""
        return self._call_shim(module, module, call_impl, self._root_pre_hook)

    def _call_shim(
        self,
        root: torch.nn.Module,
        called: torch.nn.Module,
        call_impl: Callable[..., Any],
        general: Callable[[torch.nn.Module, Any], None],
    ) -> Callable[..., Any]:
        """A call shim for ``called`` (the root itself, or the ``OptimizedModule`` wrapping it,
        torch_compiled.py) that drives ``root``'s steps: :meth:`quiet_step` written out in it, so
        that the usual unsaved step runs one Python frame of ours fewer, and
        ``general(called, args)`` on every other step. The two must agree (tested)."""
        driver = self
        core = self._core
        quiet = self._quiet  # read through the closure: no object but the run's is touched
        # The shim is kept in the module's own __dict__: holding the module here (or its bound
        # _call_impl) would be a reference cycle that keeps a model the script dropped alive until
        # the hook's close or a garbage collection. A DDP model's Reducer holds the process
        # group, whose destruction then happens in trainguard's close at interpreter exit, with
        # the GIL held, where it can deadlock with a gloo thread that needs the GIL.
        called_ref = weakref.ref(called)
        root_ref = called_ref if root is called else weakref.ref(root)
        if getattr(call_impl, "__self__", None) is called:
            function = call_impl.__func__  # type: ignore[attr-defined]
        else:  # not the module's own bound method (none of ours): held as given

            def function(_module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
                return call_impl(*args, **kwargs)

        def root_call(*args: Any, **kwargs: Any) -> Any:
            module = called_ref()  # alive: it is being called
            if (
                quiet.left
                and quiet.pending
                and len(quiet.collections) == quiet.count
                and root_ref().training  # type: ignore[union-attr]
                and _is_grad_enabled()
            ):
                quiet.left -= 1
                quiet.pending = False
                if not quiet.left and (core._budget is not None or core._ends_quiet_windows):
                    driver._eager_end_quiet_window()
            else:
                general(module, args)  # type: ignore[arg-type]
            return function(module, *args, **kwargs)

        return root_call

    @fail_open
    def _end_quiet_window(self) -> None:
        """The last step of a run of unsaved ones has begun: the next may be saved."""
        core = self._core
        if core._budget is not None:
            core._budget.mark(core.step, QUIET)  # its span is one step of training
        core._before_possibly_saved_step()

    # -- roots --------------------------------------------------------------------------------
    def drive_root(self, module: torch.nn.Module) -> None:
        """Begin ``module``'s steps at each of its calls: through a call shim (no hook on the
        module, so its calls keep PyTorch's fast path) until something is compiled, else a
        forward pre-hook."""
        shim = install_root_call(module, self._root_call) if self._root_shims else None
        if shim is None:
            self.root_hooks[id(module)] = module.register_forward_pre_hook(self._root_pre_hook)
        else:
            self.root_hooks[id(module)] = shim

    def watch_for_wrappers(self) -> None:
        """Until a registered root first runs, look for a torch.compile wrapper around it."""
        if self._watch_handle is None:
            self._watch_handle = register_global_forward_pre_hook(self._watch_for_wrapper)

    def root_called(self, module: torch.nn.Module) -> None:
        """A root's own call took the general path: it runs eagerly, or was compiled after it ran."""
        if self._watch_handle is not None:
            self.unwatch()  # the root runs eagerly: no wrapper to look for
        if in_compile_wrapper() and id(module) not in self.wrapped_roots:
            # Compiled after it first ran eagerly: drive it from the wrapper from now on. This
            # one forward is already inside Dynamo; its saved-step hooks are removed before
            # the next unsaved step, and Dynamo handles removed hooks (tested).
            wrapper = find_compile_wrapper(module)
            if wrapper is not None:
                self.drive_from_wrapper(wrapper)

    def _roots_before_compile(self) -> None:
        """torch.compile was called: Dynamo may trace a root without calling its shim, and calls no
        hook added after it traced. Every root gets its pre-hook now, before anything is traced."""
        self._core._stop_signalling()  # (steps end through the post-hook again: it sees a displaced root)
        # The run of unsaved steps ends at the next step: a root compiled after it ran eagerly is
        # found on the general path (TorchHook._root_step); its pre-hook breaks the graph until then
        self._quiet.shorten(1)
        self._root_shims = False
        for key, handle in list(self.root_hooks.items()):
            if isinstance(handle, RootCall):
                module = handle.module()
                handle.remove()
                if module is None:
                    del self.root_hooks[key]
                else:
                    self.root_hooks[key] = module.register_forward_pre_hook(self._root_pre_hook)

    def roots_unseen(self) -> None:
        """The same optimizer stepped twice with no root forward seen between: where roots have
        shims, compiled code may be calling them past the shim (compiled before this hook was
        watching), or a torch.compile wrapper's own ``__call__`` does not reach its shim (a torch
        version not checked). Pre-hooks from now on; code already traced calls none until it
        retraces."""
        if any(isinstance(handle, RootCall) for handle in self.root_hooks.values()) or self._wrapper_shims:
            logger.warning(
                "trainguard: the model ran without its forward being seen (compiled code made before "
                "trainguard watched torch.compile?); steps are counted from its next traced forward"
            )
            self._roots_before_compile()
            self._wrappers_unseen()

    def redrive_displaced_roots(self) -> None:
        """A root whose shim was replaced (``model.compile()`` after registration) gets a pre-hook."""
        for key, handle in list(self.root_hooks.items()):
            if displaced(handle):
                module = handle.module()
                if module is None:
                    del self.root_hooks[key]
                else:
                    self.root_hooks[key] = module.register_forward_pre_hook(self._root_pre_hook)

    # -- compiled models: steps driven from the OptimizedModule wrapper -----------------------
    def _watch_for_wrapper(self, module: torch.nn.Module, args: Any) -> None:
        # A global pre-hook, but only until a registered root first runs: it costs nothing later.
        if is_compile_wrapper(module):
            root = module._orig_mod
            if id(root) in self.root_hooks and id(root) not in self.wrapped_roots:
                self.unwatch()
                self.drive_from_wrapper(module)
                # The wrapper's hooks for this call were listed before ours was added: run it.
                self.wrapper_pre_forward(module, args)

    def unwatch(self) -> None:
        handle, self._watch_handle = self._watch_handle, None
        if handle is not None:
            handle.remove()

    def drive_from_wrapper(self, wrapper: torch.nn.Module) -> None:
        """Steps of ``wrapper._orig_mod`` begin at the wrapper, outside the compiled region."""
        root = wrapper._orig_mod
        self.wrapped_roots.add(id(root))
        handle = self.root_hooks.pop(id(root), None)
        if handle is not None:
            handle.remove()  # Dynamo would trace it (a graph break) for torch.nn containers
        # The wrapper's own call is plain Python (OptimizedModule.__call__ sets a flag and calls
        # Module.__call__, which takes the shim's slot; a version whose call bypassed it is caught
        # by roots_unseen): Dynamo never traces it, so its shim, unlike a root's, stays when
        # something is compiled later. Pickling or copying the wrapper rebuilds it from its model
        # (OptimizedModule.__reduce__): no copy carries the shim.
        shim = install_root_call(wrapper, self._wrapper_call, own_call_reaches_slot=True)
        if shim is None:
            self._wrapper_handles.append(wrapper.register_forward_pre_hook(self.wrapper_pre_forward))
        else:
            self._wrapper_shims.append(shim)

    def _wrappers_unseen(self) -> None:
        """The wrappers' shims were not called (roots_unseen): pre-hooks on them instead."""
        shims, self._wrapper_shims = self._wrapper_shims, []
        for shim in shims:
            wrapper = shim.module()
            shim.remove()
            if wrapper is not None:
                self._wrapper_handles.append(wrapper.register_forward_pre_hook(self.wrapper_pre_forward))

    def _wrapper_call(self, wrapper: torch.nn.Module, call_impl: Any) -> Any:
        return self._call_shim(wrapper._orig_mod, wrapper, call_impl, self.wrapper_pre_forward)  # type: ignore[arg-type]

    def wrapper_pre_forward(self, wrapper: torch.nn.Module, args: Any) -> None:
        core = self._core
        if core.enabled:
            if not self.quiet_step(wrapper._orig_mod):  # type: ignore[arg-type]
                self._wrapper_step(wrapper)
        elif not self.released:
            core._release_hooks()

    @fail_open
    def _wrapper_step(self, wrapper: torch.nn.Module) -> None:
        self.leave_eager()  # left over from a forward that raised
        core = self._core
        core.root_forward(wrapper._orig_mod)  # type: ignore[arg-type]
        if not core.saving_this_step:
            return
        if self._forced_eager.enter():
            # This step's module hooks see the model run eagerly: eager names and values, and
            # no graph traced with our hooks in it. Restored by the wrapper's post-hook.
            self._wrapper_post_handle = wrapper.register_forward_hook(self._wrapper_post_forward, always_call=True)
        else:
            # torch < 2.6 has no set_stance: the compiled graph runs, and module hooks would be
            # traced into it (a break per module, on every later step). Weights, gradients and
            # losses are still saved; the module I/O of compiled models is not.
            core._module_io.detach()

    def _wrapper_post_forward(self, wrapper: torch.nn.Module, args: Any, output: Any) -> None:
        self.leave_eager()

    def leave_eager(self) -> None:
        if self._forced_eager.active:
            self._forced_eager.leave()
        handle, self._wrapper_post_handle = self._wrapper_post_handle, None
        if handle is not None:
            handle.remove()

    def close(self) -> None:
        """Every root and wrapper gets its usual calls back."""
        self.leave_eager()
        self.unwatch()
        for handle in [*self.root_hooks.values(), *self._wrapper_shims, *self._wrapper_handles]:
            handle.remove()
        self.root_hooks.clear()
        self._wrapper_shims.clear()
        self._wrapper_handles.clear()
