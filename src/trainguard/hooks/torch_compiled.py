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
from typing import Any

import torch

from trainguard.hooks.fail_open import fail_open
from trainguard.hooks.torch_root_call import RootCall, install_root_call

__all__ = ["CompiledWrapperSteps", "ForcedEager", "find_compile_wrapper", "in_compile_wrapper", "is_compile_wrapper"]


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
    frame = sys._getframe(1)
    depth = 0
    while frame is not None and depth < max_depth:
        candidate = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        if is_compile_wrapper(candidate) and candidate._orig_mod is module:
            return candidate  # type: ignore[no-any-return]
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


class CompiledWrapperSteps:
    """TorchHook's part that drives a compiled model's steps from its OptimizedModule wrapper."""

    # set by TorchHook.__init__
    _root_hooks: dict[int, Any]
    _wrapped_roots: set[int]
    _forced_eager: ForcedEager
    _wrapper_post_handle: Any
    _watch_handle: Any
    _handles: list[Any]
    saving_this_step: bool
    enabled: bool
    _released: bool
    _call_shim: Any  # TorchHook._call_shim
    _wrapper_shims: list[RootCall]
    _module_io: Any  # the saved steps' module hooks (torch_io_sources.py)

    def _watch_for_wrapper(self, module: torch.nn.Module, args: Any) -> None:
        # A global pre-hook, but only until a registered root first runs: it costs nothing later.
        if is_compile_wrapper(module):
            root = module._orig_mod
            if id(root) in self._root_hooks and id(root) not in self._wrapped_roots:
                self._unwatch()
                self._drive_from_wrapper(module)
                # The wrapper's hooks for this call were listed before ours was added: run it.
                self._wrapper_pre_forward(module, args)

    def _unwatch(self) -> None:
        handle, self._watch_handle = self._watch_handle, None
        if handle is not None:
            handle.remove()

    def _drive_from_wrapper(self, wrapper: torch.nn.Module) -> None:
        """Steps of ``wrapper._orig_mod`` begin at the wrapper, outside the compiled region."""
        root = wrapper._orig_mod
        self._wrapped_roots.add(id(root))
        handle = self._root_hooks.pop(id(root), None)
        if handle is not None:
            handle.remove()  # Dynamo would trace it (a graph break) for torch.nn containers
        # The wrapper's own call is plain Python (OptimizedModule.__call__ sets a flag and calls
        # Module.__call__, which takes the shim's slot: read in torch 2.13; a version whose call
        # bypassed it is caught by _roots_unseen): Dynamo never traces it, so its shim, unlike a
        # root's, stays when something is compiled later. Pickling or copying the wrapper
        # rebuilds it from its model (OptimizedModule.__reduce__): no copy carries the shim.
        shim = install_root_call(wrapper, self._wrapper_call, own_call_reaches_slot=True)
        if shim is None:
            self._handles.append(wrapper.register_forward_pre_hook(self._wrapper_pre_forward))
        else:
            self._wrapper_shims.append(shim)

    def _wrappers_unseen(self) -> None:
        """The wrappers' shims were not called (_roots_unseen): pre-hooks on them instead."""
        shims, self._wrapper_shims = self._wrapper_shims, []
        for shim in shims:
            wrapper = shim.module()
            shim.remove()
            if wrapper is not None:
                self._handles.append(wrapper.register_forward_pre_hook(self._wrapper_pre_forward))

    def _wrapper_call(self, wrapper: torch.nn.Module, call_impl: Any) -> Any:
        return self._call_shim(wrapper._orig_mod, wrapper, call_impl, self._wrapper_pre_forward)

    def _wrapper_pre_forward(self, wrapper: torch.nn.Module, args: Any) -> None:
        if self.enabled:
            if not self._quiet_step(wrapper._orig_mod):  # type: ignore[attr-defined]
                self._wrapper_step(wrapper)
        elif not self._released:
            self._release_hooks()

    @fail_open
    def _wrapper_step(self, wrapper: torch.nn.Module) -> None:
        self._leave_eager()  # left over from a forward that raised
        self.root_forward(wrapper._orig_mod)
        if not self.saving_this_step:
            return
        if self._forced_eager.enter():
            # This step's module hooks see the model run eagerly: eager names and values, and
            # no graph traced with our hooks in it. Restored by the wrapper's post-hook.
            self._wrapper_post_handle = wrapper.register_forward_hook(self._wrapper_post_forward, always_call=True)
        else:
            # torch < 2.6 has no set_stance: the compiled graph runs, and module hooks would be
            # traced into it (a break per module, on every later step). Weights, gradients and
            # losses are still saved; the module I/O of compiled models is not.
            self._module_io.detach()

    def _wrapper_post_forward(self, wrapper: torch.nn.Module, args: Any, output: Any) -> None:
        self._leave_eager()

    def _leave_eager(self) -> None:
        if self._forced_eager.active:
            self._forced_eager.leave()
        handle, self._wrapper_post_handle = self._wrapper_post_handle, None
        if handle is not None:
            handle.remove()
