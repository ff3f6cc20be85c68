"""How a registered root module's calls reach the hook: a call shim instead of a forward pre-hook.

Any forward hook on a module sends each of its calls down ``Module._call_impl``'s slow path (a
closure, a set and tuples of hooks built per call): on a small model, much of what an unsaved
step would cost over plain PyTorch. ``nn.Module`` has one slot of its own
for "call this instead of ``_call_impl``": ``_compiled_call_impl``, which ``Module.compile()``
fills and ``Module.__getstate__`` leaves out, so a pickled or deep-copied model (``torch.save
(model)``, an EMA copy) carries none of it. The shim put there runs the hook's step logic, then
the module's own ``_call_impl``, which, with no hook left on the module, takes its fast path.

Dynamo does not call the shim everywhere: tracing a ``torch.nn`` container wrapped by
``torch.compile`` or a compiled function that calls the model, it runs ``_call_impl`` itself, and
it never calls a hook added after it traced. So the shim exists only until something is
compiled: :func:`before_compile` tells the hook when ``torch.compile`` is called (before anything
is traced), and the hook gives its roots forward pre-hooks, as it did before shims. Where the
slot is taken (``model.compile()`` before registration) or the class routes calls its own way,
the root gets a pre-hook from the start; a shim displaced later is noticed (:func:`displaced`).
"""

from __future__ import annotations

import functools
import logging
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["RootCall", "before_compile", "displaced", "install_root_call", "shims_safe"]

logger = logging.getLogger("trainguard")

_SLOT = "_compiled_call_impl"
_MARK = "_trainguard_root_call"  # on the shim: the handle that installed it


class RootCall:
    """The handle of an installed shim: ``remove()`` gives the module back its usual calls.

    It holds the module weakly, as PyTorch's hook handles do: a model the script drops is
    not kept alive by the hook."""

    __slots__ = ("_module", "__weakref__")

    def __init__(self, module: torch.nn.Module) -> None:
        self._module = weakref.ref(module)

    def module(self) -> torch.nn.Module | None:
        return self._module()

    def installed(self) -> bool:
        module = self._module()
        return module is not None and getattr(module.__dict__.get(_SLOT), _MARK, None) is self

    def remove(self) -> None:
        if self.installed():
            del self._module().__dict__[_SLOT]  # the class's None: _call_impl as usual


def install_root_call(
    module: torch.nn.Module,
    make_call: Callable[[torch.nn.Module, Callable[..., Any]], Callable[..., Any]],
    own_call_reaches_slot: bool = False,
) -> RootCall | None:
    """Make every call of ``module`` go through ``make_call(module, call_impl)``, a function that
    does what the step needs and then returns ``call_impl(*args, **kwargs)`` (the module's own,
    hook-free, call); None where the slot is not free for it (then hook the module the usual
    way). ``own_call_reaches_slot``: the class has a ``__call__`` of its own that is known to end
    in ``Module.__call__`` (torch.compile's wrapper), which a class's own ``__call__`` otherwise
    need not."""
    if getattr(torch.nn.Module, _SLOT, False) is not None or module.__dict__.get(_SLOT) is not None:
        return None  # torch < 2.2 has no slot (Module.__call__ would never call it), or it is taken
    if type(module).__call__ is not torch.nn.Module.__call__ and not own_call_reaches_slot:
        return None
    root_call = make_call(module, module._call_impl)
    handle = RootCall(module)
    setattr(root_call, _MARK, handle)
    # written to the instance's __dict__ directly, as remove() deletes it: no Module subclass's
    # __setattr__ sees it (Module.__setattr__ would store a plain attribute there too)
    module.__dict__[_SLOT] = root_call
    return handle


def displaced(handle: Any) -> bool:
    """Whether ``handle`` is a shim something else (``model.compile()``) has since replaced."""
    return isinstance(handle, RootCall) and not handle.installed()


def shims_safe() -> bool:
    """Whether every compile so far was seen: torch.compile has been watched since before Dynamo
    was first imported, or Dynamo was never imported. (Dynamo does not say whether anything was
    compiled, and Lightning and Transformers import it: an API hook created after their import
    in a process no hook watched before drives its roots with pre-hooks. The zero-code hook is
    created as soon as torch is imported, before them; the API's hooks watch from the import of
    this module, since constructing an optimizer imports Dynamo (torch 2.13) and scripts make
    theirs before the hook. A compile while no hook listened may have traced a root unseen.)"""
    return (_watched_before_dynamo and not _unheard_compile) or "torch._dynamo" not in sys.modules


# Callbacks (weakly held bound methods) to run before torch.compile does anything
_watched_before_dynamo = False  # torch.compile watched since before anything could be compiled
_unheard_compile = False  # torch.compile was called while no hook listened
_compile_listeners: list[weakref.WeakMethod[Callable[[], None]]] = []


def before_compile(callback: Callable[[], None]) -> None:
    """Have ``callback`` (a bound method, held weakly) called whenever ``torch.compile`` is, before
    it returns: compiling is lazy, so nothing has been traced by then."""
    _watch_compile()
    _compile_listeners.append(weakref.WeakMethod(callback))


def _watch_compile() -> None:
    global _watched_before_dynamo
    if getattr(torch.compile, _MARK, False):
        return  # watched already (once per process; the wrapper stays, it only calls listeners)
    _watched_before_dynamo = "torch._dynamo" not in sys.modules
    original = torch.compile

    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:  # noqa: A001 - it stands in for torch.compile
        global _unheard_compile
        heard = False
        for reference in list(_compile_listeners):
            callback = reference()
            if callback is None:
                _compile_listeners.remove(reference)
                continue
            heard = True
            try:
                callback()
            except Exception:  # noqa: BLE001 - the user's compile goes on whatever our part does
                logger.debug("trainguard: preparing for torch.compile failed", exc_info=True)
        if not heard:
            _unheard_compile = True
        return original(*args, **kwargs)

    setattr(compile, _MARK, True)
    torch.compile = compile


# From the import on (see shims_safe): the wrapper only calls the listeners hooks add.
_watch_compile()
