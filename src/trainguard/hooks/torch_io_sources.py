"""Which modules a saved step hooks: every one, or for a light save those that give it something.

Forward hooks of the registered modules (and of registered losses) exist only during saved steps,
as the gradient hooks do: an unsaved step costs the root's call shim, no call per module. The
hooks put on modules are :class:`LeftOutOfCopies`: a model pickled or deep-copied during a saved
step (``torch.save(model)``, an EMA copy) carries a no-op in their place, not the hook.

A step that saves only the light collections (losses, scalars: what an overhead budget keeps most
often) needs the I/O of one or two modules, usually the loss module. Hooking every module for it
(the zero-code hook's global hooks send every module call down PyTorch's slow path with two
Python calls) was over a third of the Python such a save ran (cProfile, the 1 ms MLP saving its
loss every step: 1.72 M function calls in 2,000 steps, 1.22 M with this). So the modules whose I/O
a light step saved are remembered, per due set, from steps with every module hooked; once two such
steps in a row saw the same modules (the same objects, alive) and held the same names, the next
light steps hook only those. Every ``RECHECK_EVERY``-th one hooks everything again, and a narrow
step that misses one of its modules, or holds a name the fully hooked ones did not (another loss
module took over: its loss reached ``backward()`` unclaimed), drops that name and makes the next
step look again: a narrow step never saves under a name a fully hooked one would not use. Modules
created during each forward (a Hugging Face model's ``CrossEntropyLoss()``) never repeat as
objects: those steps stay fully hooked. Kept with the save plans, so a change of collections
forgets it.
"""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any

import torch

from trainguard.hooks.overhead_budget import LIGHT_COLLECTIONS

__all__ = ["RECHECK_EVERY", "LeftOutOfCopies", "ModuleIOSources", "same_modules"]

RECHECK_EVERY = 8  # narrow light steps between two fully hooked ones


class LeftOutOfCopies(functools.partial):  # type: ignore[type-arg]
    """A module hook that copies of the module do not carry: called, it is its function (a
    partial runs in C: no Python frame more); pickled or deep-copied with the module, it becomes
    ``sys.audit`` with an event no one listens to, a no-op that needs nothing of trainguard to
    load. Otherwise ``torch.save(model)`` during a saved step fails on the hook's state (an
    open writer, locks) and crashes training, and a ``copy.deepcopy(model)`` takes the hook along."""

    def __reduce__(self) -> tuple[Any, ...]:
        return functools.partial, (sys.audit, "trainguard.hook_left_out")


def same_modules(first: list[torch.nn.Module] | None, second: list[torch.nn.Module] | None) -> bool:
    """Whether two hook plans (None: every module) hook the same modules."""
    if first is None or second is None:
        return first is second
    return len(first) == len(second) and all(a is b for a, b in zip(first, second, strict=True))


class _Sources:
    """The modules one due set's light steps saved I/O of."""

    __slots__ = ("confirmed", "held", "modules", "narrowed")

    def __init__(self, modules: list[torch.nn.Module], held: frozenset[str]) -> None:
        self.modules = tuple(weakref.ref(module) for module in modules)
        self.held = held  # names held to the step's end (a loss from backward(), functional ones)
        self.confirmed = 1  # fully hooked steps in a row that saw exactly these
        self.narrowed = 0  # narrow steps since the last fully hooked one

    def same(self, modules: list[torch.nn.Module]) -> bool:
        return len(modules) == len(self.modules) and all(
            reference() is module for reference, module in zip(self.modules, modules, strict=True)
        )

    def alive(self) -> list[torch.nn.Module] | None:
        modules = [reference() for reference in self.modules]
        return None if any(module is None for module in modules) else modules  # type: ignore[return-value]


class ModuleIOSources:
    """Mixed into TorchHook: the forward hooks of saved steps. TorchHook.__init__ calls
    :meth:`_init_io_sources`; ``capture_module_io`` calls :meth:`_note_io_source` when it saved."""

    _due: frozenset[str]
    _plan_cache: dict[tuple[Any, ...], Any]
    _held: dict[str, Any]
    _registered_roots: list[weakref.ref[torch.nn.Module]]
    _loss_modules: list[weakref.ref[torch.nn.Module]]
    _forward_hook: Any

    def _init_io_sources(self) -> None:
        self._module_hook_handles: list[Any] = []
        self._module_hooks_on = False
        # This step's choice, made as it begins (None: every module)
        self._io_plan: list[torch.nn.Module] | None = None
        self._io_key: tuple[Any, ...] | None = None  # set while this step observes or is narrow
        self._io_narrow: list[torch.nn.Module] | None = None  # the modules this step hooks, if narrow
        self._io_seen: dict[int, torch.nn.Module] = {}  # modules whose I/O this step saved
        self._io_record: _Sources | None = None  # what was known as the step began

    def _hook_tree(self, root: torch.nn.Module, handles: list[Any]) -> None:
        for child in root.modules():
            handles.append(child.register_forward_hook(self._forward_hook))

    def _attach_module_hooks(self) -> None:
        plan = self._io_plan
        if self._module_hooks_on:
            if same_modules(plan, self._io_narrow):
                return  # a later forward of the same step, or a saved step like the one before
            self._detach_module_hooks()
        self._module_hooks_on = True
        self._io_narrow = plan
        if plan is not None:
            for module in plan:
                self._hook_io_source(module, self._module_hook_handles)
            return
        for reference in self._registered_roots:
            root = reference()
            if root is not None:
                self._hook_tree(root, self._module_hook_handles)
        for reference in self._loss_modules:
            loss = reference()
            if loss is not None:
                self._module_hook_handles.append(loss.register_forward_hook(self._forward_hook))

    def _hook_io_source(self, module: torch.nn.Module, handles: list[Any]) -> None:
        """Hook one module of a narrow (light) step."""
        handles.append(module.register_forward_hook(self._forward_hook))

    def _detach_module_hooks(self) -> None:
        self._module_hooks_on = False
        self._io_narrow = None
        handles, self._module_hook_handles = self._module_hook_handles, []
        for handle in handles:
            handle.remove()

    def _narrow_modules(self) -> list[torch.nn.Module] | None:
        """The modules a light step may hook instead of all of them; None: hook them all."""
        self._io_seen.clear()
        self._io_key = None
        if not self._due <= LIGHT_COLLECTIONS:
            return None
        key = ("io sources", self._due)
        self._io_key = key
        sources: _Sources | None = self._plan_cache.get(key)
        self._io_record = sources
        if sources is None or sources.confirmed < 2 or sources.narrowed >= RECHECK_EVERY:
            return None
        modules = sources.alive()
        if modules is not None:
            sources.narrowed += 1
        return modules

    def _note_io_source(self, module: torch.nn.Module) -> None:
        if self._io_key is not None:
            self._io_seen[id(module)] = module

    def _settle_io_sources(self) -> None:
        """At a saved step's end, before what it held is written: learn from a fully hooked light
        step, check a narrow one."""
        key, self._io_key = self._io_key, None
        seen, self._io_seen = list(self._io_seen.values()), {}
        sources, self._io_record = self._io_record, None
        if key is None:
            return
        held = frozenset(self._held)
        if self._io_narrow is not None and sources is not None:
            if not (sources.same(seen) and held == sources.held):
                # A module gave nothing, or a loss came from elsewhere (a new loss module, not
                # hooked: its loss reached backward() unclaimed): look at every module again, and
                # drop what a fully hooked step would have named differently.
                for name in held - sources.held:
                    del self._held[name]
                self._plan_cache.pop(key, None)
            return
        if self._plan_cache.get(key) is not sources:
            sources = None  # collections changed during the step (a new membership): learn anew
        if sources is not None and sources.same(seen) and held == sources.held:
            sources.confirmed += 1
            sources.narrowed = 0
        else:
            self._plan_cache[key] = _Sources(seen, held)
