"""The PyTorch hook, with smdebug's API: an smdebug script ports by changing its import.

Step boundaries: in a loop driven by a torch optimizer (one holding the model's parameters
exists at the first training forward, or one has stepped), a TRAIN step ends with
``optimizer.step()`` (global optimizer hooks), so gradient accumulation and several forwards
per step stay one step, from the first window on. It is written out at the next forward, mode
change or ``close()``, so that values saved right after ``optimizer.step()``
(``hook.save_scalar("loss", loss)``) still belong to it. Otherwise, and in EVAL/PREDICT, every
root forward begins a step (smdebug's rule).
Weights are saved when a step begins (the values the forward uses), gradients as the
optimizer steps (a global step pre-hook reads ``.grad`` of the parameters whose
``register_post_accumulate_grad_hook`` fired): the gradient the optimizer applies, after DDP's
all-reduce, clipping or AMP unscaling. Before any optimizer has stepped they are also copied
when accumulated, for loops without a torch optimizer.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from trainguard.config.collections import Collection
from trainguard.hooks.base import BaseHook
from trainguard.hooks.closure_steps import ClosureSteps
from trainguard.hooks.fail_open import fail_open
from trainguard.hooks.quiet_run import CountsQuietSteps, QuietRun
from trainguard.hooks.sentinel import StepSentinel
from trainguard.hooks.step_driver import StepDriver, eager
from trainguard.hooks.step_losses import StepLosses
from trainguard.hooks.torch_activations import ActivationWatch, is_loss_module, typed_memberships
from trainguard.hooks.torch_compiled import is_compile_wrapper
from trainguard.hooks.torch_data_identity import DataIdentity
from trainguard.hooks.torch_fingerprint import ReplicaFingerprints
from trainguard.hooks.torch_io_sources import LeftOutOfCopies, ModuleIOHooks
from trainguard.hooks.torch_model_scopes import ModelScopes
from trainguard.hooks.torch_optimizer import OptimizerSteps
from trainguard.hooks.torch_parameters import ParameterRoles
from trainguard.hooks.torch_saving import TensorSaver
from trainguard.hooks.torch_tensors import flatten_tensors
from trainguard.modes import ModeKeys

__all__ = ["TorchHook", "eager", "is_loss_module"]

logger = logging.getLogger("trainguard")


class TorchHook(CountsQuietSteps, OptimizerSteps, BaseHook):
    """Captures weights, biases, gradients, losses and module inputs/outputs of PyTorch models."""

    starts_writer_ahead = True  # its writer process starts before the first step (writer/spawn.py)
    # what the unsaved step and the optimizer's post-hook read, beside BaseHook's (see there)
    __slots__ = (
        "_quiet",
        "_optimizer_driven",
        "_presumed_forwards",
        "_optimizer_parameters",
    )

    framework = "pytorch"
    # The replica fingerprint writes only in a distributed run (hooks/torch_fingerprint.py), a
    # few numbers per parameter: on by default so that ReplicaDivergence can judge any DDP job
    default_collections = (*BaseHook.default_collections, "replica_fingerprints")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The current run of TRAIN steps the schedule saves nothing in (the unsaved step's fast
        # path), and whether an optimizer stepped since the last forward: optimizer.step() ran,
        # so the step ends at the next forward (or mode change, or close), and
        # save_scalar("loss", ...) written after optimizer.step() still lands in this step. One
        # object for the hook's life: call shims hold it (quiet_run.py).
        self._quiet = QuietRun()
        super().__init__(*args, **kwargs)
        # one gradient of every optimizer step, saved or not: a non-finite one gets its step saved (sentinel.py)
        self._sentinel = StepSentinel(self, self._quiet)
        # how each root's calls reach the hook, and the unsaved step's check (step_driver.py);
        # first: what follows imports Dynamo (torch_root_call.shims_safe)
        self._driver = StepDriver(self, self._quiet)
        self._handles: list[Any] = []
        self._module_names: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
        self._model_scopes = ModelScopes()  # which model a module tensor name belongs to
        self._typed_modules: weakref.WeakKeyDictionary[torch.nn.Module, None] = weakref.WeakKeyDictionary()
        self._roots: list[tuple[weakref.ref[torch.nn.Module], str]] = []
        self._hooked_parameters: set[int] = set()
        # which root inputs are data, not the model's own outputs fed back (torch_data_identity.py)
        self._data_identity = DataIdentity(self.collection_manager, self.add_membership)
        # every trainable parameter that is not a bias is a weight, whatever its name
        self._parameter_roles = ParameterRoles(self.collection_manager, self.add_membership)
        self._fingerprints = ReplicaFingerprints(self)  # per-rank parameter fingerprints (torch_fingerprint.py)
        # Gradients are read as the optimizer steps, of the parameters whose .grad changed since
        # the saved step began (torch_optimizer.py); a run without an optimizer hooks them, only
        # while steps are saved. (parameter, "gradient/<name>", its hook for such runs)
        self._gradient_sources: list[tuple[weakref.ref[torch.Tensor], str, Any]] = []
        self._step_handles: list[Any] = []
        self._node_hooked = False
        self._grad_baseline: Any = None  # the gradients as a saved step began (torch_optimizer.py)
        # Host copies taken this step, by tensor: in a Sequential, a module's output is the next
        # one's input, and both names are saved; one copy serves both (same object, unchanged
        # version), which halves the copying of activations.
        self._saver = TensorSaver(self)
        self._step_losses = StepLosses()  # a loss passed on as a module's output is saved once (step_losses.py)
        self._explicit_mode = False
        self._optimizer_driven = False
        self._forward_seen = False  # until then optimizer steps end steps (OptimizerSteps._step_without_forward)
        self._closures = ClosureSteps()  # an LBFGS closure's evaluations are steps (closure_steps.py)
        self._optimizer_parameters: dict[int, frozenset[int]] = {}
        self._independent_optimizers = 1
        # Before any optimizer has stepped: whether one that holds our parameters exists (then
        # the first accumulation window is one step too), and how many forwards that guess has
        # covered without an optimizer.step() (see _presume_optimizer).
        self._optimizer_probed = False
        self._created_optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._presumed_forwards: int | None = None
        # gradient name -> its parameter, whose .grad is read when final: at optimizer.step()
        self._grad_parameters: dict[str, torch.Tensor] = {}
        # The pre-hook takes the gradients an optimizer applies: it exists only while a step that
        # saves gradients runs (_attach_step_hooks), not a call on every step. The post-hook ends
        # steps (during a run of unsaved steps, the only optimizer does: torch_optimizer.py).
        self._post_hook = self._after_optimizer_step  # one bound method: put back as it was
        self._post_handle = register_optimizer_step_post_hook(self._post_hook)
        self._handles.append(self._post_handle)
        self._init_end_signal()
        # Functional activations (torch_activations.py): a torch-function mode that exists only
        # during the root forward of a step saving an activation collection.
        self._activations = ActivationWatch(self, self._saver.save)
        # Forward hooks exist only during saved steps (torch_io_sources.py). Under torch.compile
        # the root's pre-hook sits on the OptimizedModule wrapper instead, and a saved step runs
        # the model eagerly (torch_compiled.py): Dynamo never traces a hook of ours.
        self._registered_roots: list[weakref.ref[torch.nn.Module]] = []
        self._loss_modules: list[weakref.ref[torch.nn.Module]] = []
        self._forward_hook = LeftOutOfCopies(eager(self._after_forward))
        self._module_io = self._module_io_hooks()

    # -- distributed --------------------------------------------------------------------------
    def _rank_and_world(self) -> tuple[int, int]:
        distributed = torch.distributed
        if distributed.is_available() and distributed.is_initialized():
            return distributed.get_rank(), distributed.get_world_size()
        return 0, 1

    def _ensure_writer(self) -> Any:
        if torch.utils.data.get_worker_info() is not None:
            # A DataLoader worker (forked or spawned) running modules: only the training process
            # writes. A worker forked before the writer existed would otherwise create its own
            # and overwrite the training process's files as the same worker.
            self.enabled = False
            self.saving_this_step = False
            self._quiet.end()
            return None
        return super()._ensure_writer()

    def _run_facts(self) -> dict[str, object]:
        facts = self._model_scopes.facts()
        if self._independent_optimizers > 1:
            facts["independent_optimizers"] = self._independent_optimizers
        facts.update(self._fingerprints.facts())
        return facts

    def _tensors_off_cpu(self) -> bool:
        for reference in self._registered_roots:
            module = reference()
            if module is not None:
                for parameter in module.parameters():
                    return parameter.device.type != "cpu"
        return False

    # -- registration -------------------------------------------------------------------------
    def _name_tree(self, module: torch.nn.Module) -> str:
        """Name a root module and its children as smdebug does; return the root's name."""
        root_name = self._model_scopes.unique_root_name(module._get_name(), {name for _, name in self._roots})
        prefix = self._model_scopes.prefix(root_name, module)  # unique names across models too
        for child_name, child in module.named_modules():
            if child not in self._module_names:
                self._module_names[child] = prefix + child_name if child_name else root_name
        self._roots.append((weakref.ref(module), root_name))
        self._parameter_roles.add_model(root_name, module)
        self._fingerprints.add_model(root_name, module)
        for parameter_name, parameter in module.named_parameters():
            if parameter.requires_grad and id(parameter) not in self._hooked_parameters:
                self._hooked_parameters.add(id(parameter))
                full_name = f"{root_name}_{parameter_name}"
                gradient_name = f"gradient/{full_name}"
                self._gradient_sources.append(
                    (weakref.ref(parameter), gradient_name, self._gradient_hook(gradient_name))
                )
        return root_name

    def register_module(self, module: torch.nn.Module) -> None:
        """Capture ``module``: its parameters, gradients, and its children's inputs/outputs."""
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"register_module needs a torch.nn.Module, got {type(module).__name__}")
        wrapper = None
        if is_compile_wrapper(module):  # hook.register_module(torch.compile(model))
            wrapper, module = module, module._orig_mod  # type: ignore[assignment]
        self._name_tree(module)
        self._registered_roots.append(weakref.ref(module))
        self._driver.drive_root(module)
        if wrapper is not None:
            self._driver.drive_from_wrapper(wrapper)
        else:
            self._driver.watch_for_wrappers()
        if self._module_io.handles:  # registered during a saved step: capture it now too
            self._module_io.hook_tree(module)

    register_hook = register_module  # smdebug's older name

    def register_loss(self, loss_module: torch.nn.Module) -> None:
        """Capture a loss module's output (``<LossClass>_output_0``) and its inputs."""
        self._module_names[loss_module] = loss_module._get_name()
        self._loss_modules.append(weakref.ref(loss_module))
        if self._module_io.handles:
            self._module_io.hook_loss(loss_module)

    # -- what a run of unsaved steps was counted under ends it -----------------------------------
    def disable(self, reason: BaseException | str) -> None:
        self._quiet.end()  # the next step takes the general path, which takes the hooks away
        super().disable(reason)

    def get_collection(self, name: str) -> Collection:
        self._quiet.end()  # the caller may change the collection's schedule or patterns
        return super().get_collection(name)

    def add_collection(self, collection: Collection) -> None:
        self._quiet.end()
        super().add_collection(collection)

    # Whether _before_possibly_saved_step does anything (else the end of a run of unsaved steps
    # is only the budget's business, and costs no call without one)
    _ends_quiet_windows = False

    def _before_possibly_saved_step(self) -> None:
        """Called at the last step of a run of certainly unsaved steps (ZeroCodeHook's)."""

    # -- step boundaries ----------------------------------------------------------------------
    def set_mode(self, mode: ModeKeys) -> None:
        self._stop_signalling()
        self._explicit_mode = True
        self._quiet.end()
        super().set_mode(mode)

    def _mode_of(self, module: torch.nn.Module) -> ModeKeys:
        if self._explicit_mode:
            return self.mode
        return ModeKeys.TRAIN if module.training and torch.is_grad_enabled() else ModeKeys.EVAL

    def _root_pre_forward_general(self, module: torch.nn.Module, args: Any) -> None:
        if self._data_identity.watching:
            self._data_identity.next_root_call(self.module_name(module), flatten_tensors(args))
        if self.enabled:
            self._root_step(module)
        elif not self._driver.released:
            self._release_hooks()

    def _release_hooks(self) -> None:
        """Once capture is disabled (an internal error), take every per-step hook away so that
        training runs as without trainguard. Done here, in the training thread at its next
        forward: the writer thread that may have disabled the hook must not edit hook dicts
        PyTorch is reading."""
        self._driver.released = True
        try:
            self._stop_signalling()
            self._activations.stop()
            self._driver.leave_eager()
            self._driver.unwatch()
            self._module_io.detach()
            self._detach_step_hooks()
            self._sentinel.close()
            self._fingerprints.close()
        except Exception:  # noqa: BLE001 - already disabled: nothing may reach training
            logger.debug("trainguard: could not remove every hook after capture was disabled", exc_info=True)

    @fail_open
    def _root_step(self, module: torch.nn.Module) -> None:
        self._driver.root_called(module)
        self.root_forward(module)

    def root_forward(self, module: torch.nn.Module) -> None:
        if self._driver.quiet_step(module):
            return
        self._forward_seen = True
        if self._signalling is not None:
            self._stop_signalling()
        if self._quiet.pending or (self.step_open and self.mode is ModeKeys.TRAIN
                                   and self._closures.updated_within(self.step)):  # fmt: skip
            self.end_step()
        mode = self._mode_of(module)
        if mode != self.mode:
            BaseHook.set_mode(self, mode)
        if mode in (ModeKeys.TRAIN, ModeKeys.GLOBAL):
            self._presume_optimizer()
        if mode in (ModeKeys.TRAIN, ModeKeys.GLOBAL) and self._optimizer_driven:
            self.ensure_step()
            self._closures.note(module, self.step)
        else:
            self.begin_step()
        if self.saving_this_step:
            self._module_io.attach()
        self._activations.start(module)

    def _on_step_begin(self) -> None:
        self._fingerprints.step_began()
        self._module_io.plan_step()
        weights_due, gradients_due = self._parameter_capture_due()
        if gradients_due:
            self._attach_step_hooks()
        else:
            self._detach_step_hooks()
        self._grad_parameters.clear()
        if not weights_due:
            return
        for reference, root_name in self._roots:
            module = reference()
            if module is None:
                continue
            self._saver.save_many(
                (f"{root_name}_{parameter_name}", parameter) for parameter_name, parameter in module.named_parameters()
            )

    def _parameter_capture_due(self) -> tuple[bool, bool]:
        """Whether this step saves any parameter, and any gradient.

        A step that saves only losses and scalars (most steps an overhead budget keeps) then
        skips the walk over every parameter and the gradient hooks, a Python call per parameter
        in backward. Known per due set and set of roots; kept with the plans, so it is forgotten
        whenever collections change."""
        key = ("parameters due", self._due, len(self._roots), len(self._gradient_sources))
        known = self._plan_cache.get(key)
        if known is None:
            weights_due = gradients_due = False
            for reference, root_name in self._roots:
                module = reference()
                if module is None:
                    continue
                for parameter_name, _ in module.named_parameters():
                    name = f"{root_name}_{parameter_name}"
                    weights_due = weights_due or self.plan(name) is not None
                    gradients_due = gradients_due or self.plan(f"gradient/{name}") is not None
            known = self._plan_cache[key] = (weights_due, gradients_due)
        return known

    def begin_step(self) -> None:
        super().begin_step()
        self._quiet.end()
        if not self.saving_this_step:
            counted = self._optimizer_driven and self._presumed_forwards is None and not self._explicit_mode
            if counted and self._forward_seen and self.mode is ModeKeys.TRAIN and self.enabled:
                # Closure evaluations as steps: none on the fast path (closure_steps.py), but the
                # sentinel still sees the gradient the optimizer step ends with, dated to this step
                mode_step = self.mode_steps[ModeKeys.TRAIN]
                steps = 0 if self._closures.active else self.unsaved_steps_ahead(ModeKeys.TRAIN, mode_step)
                self._quiet.begin(steps, self.include_collections)
                if steps or self._closures.active:
                    self._sentinel.run_begins(self.step, mode_step, steps)
                if steps:
                    self._signal_ends_through_optimizer()
            if self._step_handles:
                self._detach_step_hooks()
            self._module_io.detach()

    def end_step(self) -> None:
        self._quiet.pending = False
        super().end_step()
        self._saver.step_ended()
        self._sentinel.step_ended()

    def _on_step_end(self) -> None:
        self._fingerprints.step_ended()
        if self._optimizer_driven:
            self._take_gradients()  # a step that ends without optimizer.step() (mode change, close)
        self._grad_parameters.clear()
        self._module_io.settle()
        self._saver.write_held()

    def _module_io_hooks(self) -> ModuleIOHooks:
        """The saved steps' module hooks (the zero-code hook's capture more)."""
        return ModuleIOHooks(self, self._saver, self._forward_hook, self._registered_roots, self._loss_modules)

    # -- capture ------------------------------------------------------------------------------
    def save_torch_tensor(self, name: str, tensor: torch.Tensor) -> bool:
        """Save ``tensor`` now, if ``name`` is due at this step; True if it was."""
        return self._saver.save(name, tensor)

    def hold_torch_tensor(self, name: str, tensor: torch.Tensor) -> None:
        """Save ``tensor`` as the step ends; a later value of the same name replaces this one."""
        self._saver.hold(name, tensor)

    def _after_forward(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if self.saving_this_step:
            self._capture_after_forward(module, inputs, output)
        if module is self._activations.root:
            self._activations.stop()

    @fail_open
    def _capture_after_forward(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        self.capture_module_io(module, inputs, output)

    def module_name(self, module: torch.nn.Module) -> str:
        name = self._module_names.get(module)
        if name is None:
            name = module._get_name()
            self._module_names[module] = name
        return name

    def capture_module_io(self, module: torch.nn.Module, inputs: Any, output: Any) -> list[torch.Tensor]:
        flat_inputs = flatten_tensors(inputs)
        outputs = flatten_tensors(output)
        # Most modules' I/O matches no due collection (e.g. only weights and gradients are
        # saved): remember that per module, I/O arity and step schedule, and skip the name
        # lookups on every later forward. Keyed by id() with a weak reference that proves the
        # module is the same one (ids are reused after a module dies); kept with the plans, so
        # it is forgotten whenever collections change.
        silent_key = (id(module), len(flat_inputs), len(outputs), self._due)
        known = self._plan_cache.get(silent_key)
        if known is not None and known() is module:
            return outputs
        name = self.module_name(module)
        if module not in self._typed_modules:
            self._typed_modules[module] = None
            self._add_typed_memberships(module, name, flat_inputs)
        if self._data_identity.is_root(module):
            self._data_identity.saved_root_call(name, self.step, flat_inputs, outputs)
        saved = False
        for index, tensor in enumerate(flat_inputs):
            saved = self._saver.save(f"{name}_input_{index}", tensor) or saved
        for index, tensor in enumerate(outputs):
            if tensor in self._step_losses:
                continue  # the step's loss, passed on: saved under its loss name already
            saved = self._saver.save(f"{name}_output_{index}", tensor) or saved
        if saved:
            self._module_io.note_source(module)
        elif self.saving_this_step:
            self._plan_cache[silent_key] = weakref.ref(module)
        return outputs

    def _add_typed_memberships(self, module: torch.nn.Module, name: str, flat_inputs: Sequence[torch.Tensor]) -> None:
        """Put activation and loss I/O into the collections rules look for (typed_memberships);
        a root's inputs that are data are filed by DataIdentity."""
        is_root = any(reference() is module for reference, _ in self._roots)
        if is_root:
            self._data_identity.add_root(module)
        for tensor_name, collection_name in typed_memberships(module, name, flat_inputs, is_root=is_root):
            self.add_membership(tensor_name, collection_name)

    def add_membership(self, tensor_name: str, collection_name: str) -> None:
        """Make ``tensor_name`` a member of a collection without including the collection."""
        collection = self.collection_manager.get(collection_name)
        if tensor_name in collection.tensor_names:
            return
        collection.add_tensor_name(tensor_name)
        self._collections_dirty = True
        self._match_cache.pop(tensor_name, None)
        self._plan_cache.clear()

    # -- user API -----------------------------------------------------------------------------
    @fail_open
    def save_scalar(self, name: str, value: float | torch.Tensor, sm_metric: bool = False) -> None:
        """Save a scalar now as ``scalar/<name>`` (always, whatever the schedule)."""
        if isinstance(value, torch.Tensor):
            value = value.detach().float().item()
        self._save_unscheduled(f"scalar/{name}", np.array([float(value)], dtype=np.float64))

    @fail_open
    def save_tensor(
        self, tensor_name: str, tensor_value: Any, collections_to_write: str | Iterable[str] = "default"
    ) -> None:
        """Save a tensor of your own into the given collections, when they are due."""
        self.add_to_collections(tensor_name, collections_to_write)
        self._plan_cache.clear()
        self._match_cache.pop(tensor_name, None)
        self.ensure_step()
        if isinstance(tensor_value, torch.Tensor):
            self._saver.save(tensor_name, tensor_value)
        else:
            plan = self.plan(tensor_name)
            if plan is not None:
                array = np.array(tensor_value)
                self.write_tensor(tensor_name, array, nbytes=array.nbytes)

    def _save_unscheduled(self, name: str, array: np.ndarray) -> None:
        self.ensure_step()
        if not self.saving_this_step:
            # Explicit saves are written even on steps the schedule skips.
            writer = self._ensure_writer()
            if writer is None:
                return
            self.saving_this_step = True
            self._quiet.end()  # this step ends on the general path, which writes it
            self._due = frozenset()
            self._sentinel.step_ended(before=self.step)  # earlier unsaved steps are written first
            writer.begin_step(self.step, self.mode, self.mode_steps[self.mode])
        self.write_tensor(name, array, nbytes=array.nbytes)

    def close(self) -> None:
        self._stop_signalling()
        self._activations.stop()
        self._driver.close()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        super().close()
        self._sentinel.close()
        self._fingerprints.close()
        self._detach_step_hooks()
        self._module_io.detach()
