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
from typing import Any, Protocol

import torch

from trainguard.hooks.overhead_budget import LIGHT_COLLECTIONS

__all__ = ["RECHECK_EVERY", "LeftOutOfCopies", "ModuleIOHooks", "same_modules"]

RECHECK_EVERY = 8  # narrow light steps between two fully hooked ones


class LeftOutOfCopies(functools.partial):
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


class ModuleIOCore(Protocol):
    """What the module hooks read of the hook: the step's due collections and the cache that is
    forgotten whenever collections change."""

    _due: frozenset[str]
    _plan_cache: dict[tuple[Any, ...], Any]


class HeldValues(Protocol):
    held: dict[str, Any]  # name -> what the step holds until it ends (TensorSaver.held)


class ModuleIOHooks:
    """The forward hooks of saved steps on the registered roots' modules and the losses.
    ``capture_module_io`` calls :meth:`note_source` when it saved a module's I/O."""

    __slots__ = (
        "_core", "_saved", "_forward_hook", "_roots", "_losses", "handles", "_on", "_plan", "_key",
        "narrow", "_seen", "_record",
    )  # fmt: skip

    def __init__(
        self,
        core: ModuleIOCore,
        saved: HeldValues,
        forward_hook: Any,
        roots: list[weakref.ref[torch.nn.Module]],
        losses: list[weakref.ref[torch.nn.Module]],
    ) -> None:
        self._core = core
        self._saved = saved
        self._forward_hook = forward_hook
        self._roots = roots  # the hook's registered roots and loss modules (lists it appends to)
        self._losses = losses
        self.handles: list[Any] = []
        self._on = False
        self._plan: list[torch.nn.Module] | None = None  # this step's choice, made as it begins (None: every module)
        self._key: tuple[Any, ...] | None = None  # set while this step observes or is narrow
        self.narrow: list[torch.nn.Module] | None = None  # the modules this step hooks, if narrow
        self._seen: dict[int, torch.nn.Module] = {}  # modules whose I/O this step saved
        self._record: _Sources | None = None  # what was known as the step began

    def hook_tree(self, root: torch.nn.Module) -> None:
        for child in root.modules():
            self.handles.append(child.register_forward_hook(self._forward_hook))

    def hook_loss(self, loss: torch.nn.Module) -> None:
        self.handles.append(loss.register_forward_hook(self._forward_hook))

    def attach(self) -> None:
        plan = self._plan
        if self._on:
            if same_modules(plan, self.narrow):
                return  # a later forward of the same step, or a saved step like the one before
            self.detach()
        self._on = True
        self.narrow = plan
        if plan is not None:
            for module in plan:
                self.hook_source(module)
            return
        for reference in self._roots:
            root = reference()
            if root is not None:
                self.hook_tree(root)
        for reference in self._losses:
            loss = reference()
            if loss is not None:
                self.hook_loss(loss)

    def hook_source(self, module: torch.nn.Module) -> None:
        """Hook one module of a narrow (light) step."""
        self.handles.append(module.register_forward_hook(self._forward_hook))

    def detach(self) -> None:
        self._on = False
        self.narrow = None
        handles, self.handles = self.handles, []
        for handle in handles:
            handle.remove()

    def plan_step(self) -> None:
        """A saved step begins: choose the modules it hooks (:meth:`attach`)."""
        self._plan = self._narrow_modules()

    def _narrow_modules(self) -> list[torch.nn.Module] | None:
        """The modules a light step may hook instead of all of them; None: hook them all."""
        self._seen.clear()
        self._key = None
        due = self._core._due
        if not due <= LIGHT_COLLECTIONS:
            return None
        key = ("io sources", due)
        self._key = key
        sources: _Sources | None = self._core._plan_cache.get(key)
        self._record = sources
        if sources is None or sources.confirmed < 2 or sources.narrowed >= RECHECK_EVERY:
            return None
        modules = sources.alive()
        if modules is not None:
            sources.narrowed += 1
        return modules

    def note_source(self, module: torch.nn.Module) -> None:
        if self._key is not None:
            self._seen[id(module)] = module

    def settle(self) -> None:
        """At a saved step's end, before what it held is written: learn from a fully hooked light
        step, check a narrow one."""
        self._plan = None
        key, self._key = self._key, None
        seen, self._seen = list(self._seen.values()), {}
        sources, self._record = self._record, None
        if key is None:
            return
        plan_cache = self._core._plan_cache
        held_values = self._saved.held
        held = frozenset(held_values)
        if self.narrow is not None and sources is not None:
            if not (sources.same(seen) and held == sources.held):
                # A module gave nothing, or a loss came from elsewhere (a new loss module, not
                # hooked: its loss reached backward() unclaimed): look at every module again, and
                # drop what a fully hooked step would have named differently.
                for name in held - sources.held:
                    del held_values[name]
                plan_cache.pop(key, None)
            return
        if plan_cache.get(key) is not sources:
            sources = None  # collections changed during the step (a new membership): learn anew
        if sources is not None and sources.same(seen) and held == sources.held:
            sources.confirmed += 1
            sources.narrowed = 0
        else:
            plan_cache[key] = _Sources(seen, held)
