"""TorchHook's optimizer side: where a TRAIN step ends, and the gradients it saves.

A step ends with ``optimizer.step()`` (global optimizer hooks) once one has stepped, or is
presumed to when an optimizer holding the model's parameters exists by the first forward.
Gradients are read from ``.grad`` as the optimizer steps (the gradient it applies, after DDP's
all-reduce, clipping or AMP unscaling) for the parameters whose gradient changed this step: each
``.grad`` is noted (object and version) when a saved step begins and compared then, so autograd
calls no Python of ours at all. A hook on each parameter's AccumulateGrad node would tell the
same, but it outlives its removal: the node is shared by every later step as long as the last
step's graph is alive when the next forward runs (``loss = ...`` kept across iterations, the
usual loop), and a node that once had a Python hook keeps calling into Python (taking the GIL,
wrapping the gradient) at every backward after the hook was removed, for ever after the first
saved step. Runs with no optimizer to step (a hand-written
update) still need those hooks, to copy each gradient before the loop zeroes it: only they get
them. Both work outside any compiled graph: a ``torch.compile``d model needs nothing more.
"""

from __future__ import annotations

import functools
import gc
import itertools
import logging
import operator
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from trainguard.hooks.closure_steps import ClosureSteps
from trainguard.hooks.fail_open import fail_open
from trainguard.hooks.quiet_run import QuietRun
from trainguard.hooks.sentinel import StepSentinel
from trainguard.modes import ModeKeys

if TYPE_CHECKING:
    from trainguard.hooks.step_driver import StepDriver

__all__ = ["OptimizerSteps"]

logger = logging.getLogger("trainguard")

_TRAIN = ModeKeys.TRAIN  # a global: the usual step's check reads it (pytorch.py says why)
# What Optimizer.step calls after each step (see _signal_ends_through_optimizer), where it exists
_TORCH_STEP_CODE = getattr(torch.optim.Optimizer, "_optimizer_step_code", None)


def _profiler_enabled() -> bool:
    enabled = getattr(torch._C._autograd, "_profiler_enabled", None)
    return True if enabled is None else bool(enabled())  # unknown: as if it were


class AccumulationHook:
    """Calls ``hook(parameter)`` each time autograd has accumulated ``parameter``'s gradient,
    until :meth:`remove`: a post-hook on the parameter's AccumulateGrad node, which this holds
    (the parameter's own reference to it is weak: without this one, the next forward could make
    another node, without the hook). Removed, it leaves nothing behind once the node is freed."""

    __slots__ = ("_node", "_handle")

    def __init__(self, parameter: torch.Tensor, hook: Any) -> None:
        with torch.enable_grad():  # (a saved step may begin under no_grad: an explicit mode)
            self._node = parameter.view_as(parameter).grad_fn.next_functions[0][0]  # type: ignore[union-attr]
        self._handle = self._node.register_hook(lambda grad_inputs, grad_outputs: hook(parameter))  # type: ignore[union-attr]

    def remove(self) -> None:
        self._handle.remove()
        self._node = None


class OptimizerSteps:
    """Mixed into TorchHook (whose __init__ sets the attributes below)."""

    _roots: list[tuple[weakref.ref[torch.nn.Module], str]]
    _gradient_sources: list[tuple[weakref.ref[torch.Tensor], str, Any]]  # (parameter, name, its hook)
    _step_handles: list[Any]
    _node_hooked: bool  # _step_handles hold AccumulationHooks (a run without an optimizer)
    _grad_parameters: dict[str, torch.Tensor]
    # (name, parameter, its .grad when the saved step began or None, that .grad's version)
    _grad_baseline: list[tuple[str, torch.Tensor, weakref.ref[torch.Tensor] | None, int]] | None
    _optimizer_driven: bool
    _forward_seen: bool  # a registered root's forward has run (TorchHook.root_forward)
    _closures: ClosureSteps  # whether closure evaluations are steps (closure_steps.py)
    _optimizer_probed: bool
    _presumed_forwards: int | None
    _quiet: QuietRun  # the run of unsaved steps and the step-end signal (quiet_run.py)
    _sentinel: StepSentinel  # sees one gradient per unsaved optimizer step (sentinel.py)
    _optimizer_parameters: dict[int, frozenset[int]]  # id(optimizer) -> ids of its parameters
    _independent_optimizers: int
    _created_optimizers: weakref.WeakSet[Any]  # optimizers seen being created, where that is watched
    _stepping_optimizers: dict[int, weakref.ref[Any]]  # id(optimizer) -> the optimizer, of those noted
    _post_hook: Any  # the global optimizer post-hook (the bound _after_optimizer_step)
    _post_handle: Any  # ...and its handle
    _signalling: weakref.ref[Any] | None  # the optimizer whose _optimizer_step_code ends steps now
    _end_signal: Any
    _driver: StepDriver  # how roots reach the hook (step_driver.py)
    _collections_dirty: bool
    saving_this_step: bool
    enabled: bool
    mode: ModeKeys
    plan: Any  # BaseHook's
    hold_torch_tensor: Any  # TorchHook's
    step: int  # BaseHook's, and its steps:
    end_step: Any
    begin_step: Any

    # Forwards one presumed optimizer step may span before the guess is given up: far more
    # micro-batches than any accumulation window uses, few enough to keep a step small.
    MAX_PRESUMED_FORWARDS = 64

    def _presume_optimizer(self) -> None:
        """Decide, before the first optimizer.step(), whether steps will end with one.

        Once an optimizer has stepped, a step ends at optimizer.step(), so several micro-batch
        forwards (gradient accumulation) are one step. Before that, a hook cannot see the
        future; but an optimizer that holds the model's parameters already exists by the
        first training forward in any usual script, so its presence decides. A loop that has
        such an optimizer and still never steps it falls back to one step per forward after
        MAX_PRESUMED_FORWARDS forwards.
        """
        if self._presumed_forwards is not None:
            self._presumed_forwards += 1
            if self._presumed_forwards > self.MAX_PRESUMED_FORWARDS:
                self._take_gradients()
                self._optimizer_driven = False
                self._presumed_forwards = None
                logger.info("trainguard: no optimizer.step() in %d forwards: one step per forward",
                            self.MAX_PRESUMED_FORWARDS)  # fmt: skip
            return
        if self._optimizer_probed or self._optimizer_driven:
            return
        self._optimizer_probed = True
        if self._an_optimizer_holds_our_parameters():
            self._optimizer_driven = True
            self._presumed_forwards = 0

    def _an_optimizer_holds_our_parameters(self) -> bool:
        ours = {id(parameter) for reference, _ in self._roots if (root := reference()) is not None
                for parameter in root.parameters()}  # fmt: skip
        if not ours:
            return False

        def holds_ours(optimizer: Any) -> bool:
            groups = getattr(optimizer, "param_groups", None) or ()
            return any(id(parameter) in ours for group in groups for parameter in group["params"])

        # The optimizers seen being created (zero-code capture records them): a scan of every
        # object took 0.12 s of the first training step once torch._dynamo was imported.
        if any(holds_ours(optimizer) for optimizer in list(self._created_optimizers)):
            return True
        # PyTorch keeps no registry of optimizers; one scan of the tracked objects, once per hook.
        optimizer_type = torch.optim.Optimizer
        for candidate in gc.get_objects():
            # type(), not isinstance(): that would read __class__ of every object, and some
            # (deprecated torch aliases) warn when touched
            if issubclass(type(candidate), optimizer_type) and holds_ours(candidate):
                return True
        return False

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # The gradients the optimizer applies: after DDP's all-reduce, clipping, AMP unscaling,
        # all of which rewrite .grad after autograd accumulated it. (Called at every optimizer
        # step: one attribute test before anything that could fail.)
        if self.saving_this_step:
            self._take_applied_gradients()

    @fail_open
    def _take_applied_gradients(self) -> None:
        if self.mode in (ModeKeys.TRAIN, ModeKeys.GLOBAL):
            self._take_gradients()

    def _take_gradients(self) -> None:
        self._gradients_since_baseline()
        parameters, self._grad_parameters = self._grad_parameters, {}
        for name, parameter in parameters.items():
            if parameter.grad is not None:
                self.hold_torch_tensor(name, parameter.grad)

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # The usual step: an optimizer seen before, the first to step since the forward, of a
        # TRAIN step of an optimizer-driven run. The general path would only set this flag; an
        # unsaved step should cost a few attribute checks.
        if not self.enabled:
            return
        if (
            not self._quiet.pending
            and self.mode is _TRAIN
            and self._optimizer_driven
            and self._presumed_forwards is None
            and id(optimizer) in self._optimizer_parameters
        ):
            quiet = self._quiet
            quiet.pending = True
            sentinel = self._sentinel
            if sentinel.armed:  # what the C callables below append, written out (no call)
                watched = sentinel.watched.get(id(optimizer))
                if watched is not None:
                    sentinel.entries.append((watched[0].grad, quiet.left, quiet.removed, watched[1]))
            return
        self._after_optimizer_step_general(optimizer, args, kwargs)

    @fail_open
    def _after_optimizer_step_general(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.mode in (ModeKeys.TRAIN, ModeKeys.GLOBAL) and self._roots:
            after_another = self._quiet.pending  # an optimizer stepped since the last forward
            # ...or the root's forward was not seen: its call shim replaced (model.compile())
            # or bypassed (compiled code that torch.compile's watch did not see being made)
            self._driver.redrive_displaced_roots()
            if id(optimizer) not in self._optimizer_parameters:
                self._note_optimizer(optimizer, after_another)
            # An optimizer over none of the registered models' parameters (another hook's model,
            # a side model this hook does not watch) says nothing about their forwards
            only = after_another and list(self._optimizer_parameters) == [id(optimizer)]
            if only and self._steps_a_root(optimizer):
                self._driver.roots_unseen()  # the run's only optimizer, twice: not a second optimizer
            self._optimizer_driven = True
            self._presumed_forwards = None  # not presumed any more: seen
            self._quiet.pending = True
            if not self._forward_seen and self._steps_a_root(optimizer):
                self._step_without_forward()
                self._quiet.pending = True  # (end_step cleared it) the next post-hook comes here again

    def _steps_a_root(self, optimizer: Any) -> bool:
        """Whether ``optimizer`` steps a parameter of a registered model (noted optimizers only)."""
        stepped = self._optimizer_parameters.get(id(optimizer), frozenset())
        return any(
            not stepped.isdisjoint(id(parameter) for parameter in root.parameters())
            for reference, _ in self._roots
            if (root := reference()) is not None
        )

    def _step_without_forward(self) -> None:
        """No registered model's forward has ever been seen, yet its parameters are stepped: a
        forward-forward net trains each layer through ``layer.forward(x)`` called directly (no
        module call at all), or compiled code calls the model past its call shim. Steps begin at
        root forwards, so such a run saved nothing, not even a collections file. Here each
        optimizer step ends the step and begins the next instead (its weights are those the next
        step uses; its gradients are taken as that optimizer steps, as on any saved step). Every
        such step comes through this general path: the fast path of unsaved steps counts root
        forwards, and there are none (TorchHook.begin_step starts no run of unsaved steps)."""
        if self.step < 0:
            logger.info("trainguard: optimizer.step() without a forward of the registered model: "
                        "a step per optimizer step")  # fmt: skip
        self.end_step()
        self.begin_step()

    # -- unsaved steps ended without a Python call ----------------------------------------------
    def _init_end_signal(self) -> None:
        self._stepping_optimizers = {}
        self._signalling = None
        self._end_signal = None  # the callable the optimizer carries while it signals

    def _signal_ends_through_optimizer(self) -> None:
        """A run of unsaved steps begins (begin_step). The global post-hook is one Python call a
        step, a measurable share of a small model's step; with one optimizer stepping the run,
        its own ``_optimizer_step_code`` (which ``Optimizer.step`` calls after every step, for
        PyTorch's profiler) ends the step instead, set to C callables, and the post-hook is taken
        away. Everything that could need
        it back comes through the general path first (root_forward, set_mode, torch.compile,
        close, a new optimizer under zero-code), which puts it back (:meth:`_stop_signalling`).
        Not while PyTorch's profiler runs (it watches that method), nor where another optimizer
        exists that could begin stepping unseen."""
        if self._signalling is not None or len(self._optimizer_parameters) != 1:
            return
        if len(self._created_optimizers) > 1 or _profiler_enabled():
            return
        reference = self._stepping_optimizers.get(next(iter(self._optimizer_parameters)))
        optimizer = reference() if reference is not None else None
        hooks = self._post_handle.hooks_dict_ref()
        if optimizer is None or hooks is None or "_optimizer_step_code" in vars(optimizer):
            return
        if getattr(type(optimizer), "_optimizer_step_code", None) is not _TORCH_STEP_CODE:
            return  # a class of its own there (or a PyTorch without it): its code must run
        if hooks.get(self._post_handle.id) is not self._post_hook:
            return
        # C callables throughout, no Python frame: each call sets _quiet.pending, as the post-hook
        # would, for the optimizer steps the run can have (its first step's and one per unsaved
        # step; the next step takes the general path, which stops this). One call more means a
        # forward went unseen (compiled code calling the model past its call shim): then the
        # post-hook comes back and is told of that step, and sees what it would have seen.
        quiet = self._quiet
        flags: Iterator[bool] = itertools.repeat(True, quiet.left + 1)
        watched = self._sentinel.watched.get(id(optimizer)) if self._sentinel.armed else None
        if watched is not None:
            # ...and each call appends (the watched .grad, left, removed, its name) to the
            # sentinel's entries first, as the post-hook's usual path does (sentinel.py)
            parameter, name = watched
            entry = zip(
                map(operator.attrgetter("grad"), itertools.repeat(parameter)),
                map(operator.attrgetter("left"), itertools.repeat(quiet)),
                map(operator.attrgetter("removed"), itertools.repeat(quiet)),
                itertools.repeat(name),
            )
            appended = map(self._sentinel.entries.append, entry)
            flags = itertools.islice(map(operator.is_, appended, itertools.repeat(None)), quiet.left + 1)
        ends = map(functools.partial(setattr, quiet, "pending"), flags)
        self._end_signal = functools.partial(next, itertools.chain(ends, self._signals_overrun()))
        optimizer._optimizer_step_code = self._end_signal
        del hooks[self._post_handle.id]
        self._signalling = reference

    def _signals_overrun(self) -> Iterator[None]:
        """More optimizer steps than the run of unsaved steps has: end signalling, and hand this
        step to the post-hook (the optimizer calls this from its step: it must never raise)."""
        while True:
            try:
                reference = self._signalling
                optimizer = reference() if reference is not None else None
                self._stop_signalling()
                if optimizer is not None and self.enabled:
                    self._post_hook(optimizer, (), {})
            except Exception:  # noqa: BLE001 - fail open: inside the user's optimizer.step()
                logger.debug("trainguard: could not hand an optimizer step back to the post-hook", exc_info=True)
            yield

    def _stop_signalling(self) -> None:
        """Put the global post-hook back and the optimizer's own ``_optimizer_step_code``. Runs
        whether or not capture is enabled (a disabled hook takes its hooks away through it), in
        places that must not raise into training (an optimizer's creation): it never raises."""
        reference, self._signalling = self._signalling, None
        if reference is None:
            return
        try:
            optimizer = reference()
            signal, self._end_signal = self._end_signal, None
            if optimizer is not None and vars(optimizer).get("_optimizer_step_code") is signal:
                del optimizer._optimizer_step_code
            hooks = self._post_handle.hooks_dict_ref()
            if hooks is not None and not self._driver.released:
                hooks[self._post_handle.id] = self._post_hook
        except Exception:  # noqa: BLE001 - fail open: at worst steps are counted less exactly
            logger.debug("trainguard: could not put the optimizer post-hook back", exc_info=True)

    def _note_optimizer(self, optimizer: Any, after_another: bool) -> None:
        """Count the optimizers that step parameters no other one steps, each after a forward of
        its own (a GAN's generator and discriminator, an actor and a critic): their losses work
        against each other and need not fall, which LossNotDecreasing reads from the collections
        file's ``_meta``. Optimizers stepped one after the other on one backward (sparse embedding
        and dense parameters) share one loss and are not counted."""
        parameters = frozenset(id(p) for group in optimizer.param_groups for p in group["params"])
        disjoint = all(parameters.isdisjoint(other) for other in self._optimizer_parameters.values())
        if disjoint and self._optimizer_parameters and not after_another:
            self._independent_optimizers += 1
            self._collections_dirty = True  # rewritten before the next saved step's index
        self._optimizer_parameters[id(optimizer)] = parameters
        names = {id(parameter): name for reference, name, _ in self._gradient_sources
                 if (parameter := reference()) is not None}  # fmt: skip
        self._sentinel.watch(optimizer, names)
        try:
            self._stepping_optimizers[id(optimizer)] = weakref.ref(optimizer)
        except TypeError:  # a class with __slots__ and no __weakref__: its steps keep the post-hook
            pass

    def _attach_step_hooks(self) -> None:
        """Hook every optimizer step's start (the gradients it applies) for this saved step, and
        note each gradient as it is now; in a run without an optimizer, hook each parameter's
        gradient instead (_gradient_hook). Removed when a step saving no gradient begins."""
        # (closure evaluations as steps: the next evaluation's zero_grad() drops the gradient
        # before its forward ends the step, so it is held as autograd accumulates it)
        node_hooked = not self._optimizer_driven or self._closures.active
        if self._step_handles and self._node_hooked != node_hooked:
            self._detach_step_hooks()  # an optimizer has stepped since: its hook replaces theirs
        if not self._step_handles:
            self._node_hooked = node_hooked
            self._step_handles.append(register_optimizer_step_pre_hook(self._before_optimizer_step))
            if node_hooked:
                for reference, _, hook in self._gradient_sources:
                    parameter = reference()
                    if parameter is not None and parameter.requires_grad:
                        self._step_handles.append(AccumulationHook(parameter, hook))
        self._grad_baseline = None if node_hooked else self._gradients_now()

    def _gradients_now(self) -> list[tuple[str, torch.Tensor, weakref.ref[torch.Tensor] | None, int]]:
        now: list[tuple[str, torch.Tensor, weakref.ref[torch.Tensor] | None, int]] = []
        for reference, name, _ in self._gradient_sources:
            parameter = reference()
            if parameter is None or not parameter.requires_grad or self.plan(name) is None:
                continue
            grad = parameter.grad
            if grad is None:
                now.append((name, parameter, None, 0))
            else:
                now.append((name, parameter, weakref.ref(grad), grad._version))
        return now

    def _gradients_since_baseline(self) -> None:
        """Add the parameters whose ``.grad`` changed since the saved step began to those read
        (once a step: an optimizer stepped after another on the same backward reads nothing
        more). Autograd accumulating into ``.grad`` bumps its version, setting it (a first
        gradient after ``zero_grad()``, ``create_graph``) makes a new tensor. A gradient zeroed
        in place between the forward and backward of a step that then gives it none (Lightning
        zeroes there, but to None) would count as changed: its zeros are saved."""
        baseline, self._grad_baseline = self._grad_baseline, None
        for name, parameter, grad_reference, version in baseline or ():
            grad = parameter.grad
            if grad is None:
                continue
            if grad_reference is None or grad_reference() is not grad or grad._version != version:
                self._grad_parameters[name] = parameter

    def _detach_step_hooks(self) -> None:
        handles, self._step_handles = self._step_handles, []
        self._grad_baseline = None
        for handle in handles:
            handle.remove()

    def _gradient_hook(self, name: str):  # type: ignore[no-untyped-def]

        @fail_open
        def hook(self: Any, parameter: torch.Tensor) -> None:
            if self.saving_this_step and parameter.grad is not None and self.plan(name) is not None:
                if not self._optimizer_driven or self._presumed_forwards is not None or self._closures.active:
                    # No optimizer has stepped (there may be none, and the step may then end after
                    # the gradients were zeroed): copy now; an optimizer.step() re-reads them.
                    self.hold_torch_tensor(name, parameter.grad)
                self._grad_parameters[name] = parameter

        return lambda parameter: hook(self, parameter)
