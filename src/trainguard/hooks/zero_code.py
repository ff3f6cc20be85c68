"""Zero code change: capture a stock PyTorch script through PyTorch's own global hooks.

Nothing in the user's script or in PyTorch is edited. Installed once per process (by the
``sitecustomize`` that ``trainguard run`` puts on ``PYTHONPATH``), the hook watches:

* every module forward (``register_module_forward_pre_hook``/``register_module_forward_hook``):
  a forward that starts with no other module running is a *root* forward; its module tree is
  named as smdebug names it and its parameters' gradients are read as the optimizer steps.
  Loss modules (class name ending in ``Loss``) are losses, never roots.
* every optimizer step (``register_optimizer_step_post_hook``): the end of a TRAIN step. During
  a run of unsaved steps with one optimizer, that optimizer's own ``_optimizer_step_code`` (set
  on the instance, and taken off again) tells it instead, without a Python call
  (torch_optimizer.py).
* functional losses (``torch.nn.functional.cross_entropy`` & co) and ``torch.autograd.backward``
  (which ``Tensor.backward`` calls): the tensor a backward starts from is the step's loss even
  when no loss module exists. These module functions are wrapped, not edited, and only while a
  step saves something (until a root is found, and then during saved steps): on the usual
  unsaved step they are PyTorch's own functions, two Python calls less.
  ``torch.Tensor`` itself is never changed. :meth:`close` restores them.

TRAIN and EVAL are told apart by ``module.training`` and ``torch.is_grad_enabled()``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from trainguard.hooks.fail_open import fail_open
from trainguard.hooks.pytorch import TorchHook, eager, is_loss_module
from trainguard.hooks.torch_activations import has_class_targets
from trainguard.hooks.torch_compiled import is_compile_wrapper
from trainguard.hooks.torch_global_hooks import register_global_forward_hook, register_global_forward_pre_hook
from trainguard.hooks.torch_io_sources import LeftOutOfCopies, ModuleIOHooks
from trainguard.hooks.torch_process_groups import ProcessGroupKeeper
from trainguard.hooks.torch_root_call import RootCall

__all__ = ["FUNCTIONAL_LOSSES", "SwappedAttributes", "ZeroCodeHook", "ZeroCodeModuleIO"]

FUNCTIONAL_LOSSES = (
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "poisson_nll_loss",
    "gaussian_nll_loss", "cosine_embedding_loss", "margin_ranking_loss", "hinge_embedding_loss",
    "soft_margin_loss", "multilabel_soft_margin_loss", "multilabel_margin_loss", "multi_margin_loss",
    "triplet_margin_loss", "ctc_loss",
)  # fmt: skip
BACKWARD_LOSS_NAME = "loss_backward_output_0"


class SwappedAttributes:
    """Replacements of attributes (a module's function, a class's method) that are put on their
    owners only while wanted. Put on only where the owner still holds the original, taken off
    only where it still holds the replacement: a library that patched the same attribute in
    between keeps its patch (and a replacement it wrapped keeps working: it checks the step)."""

    def __init__(self) -> None:
        self._entries: list[tuple[Any, str, Any, Any]] = []  # (owner, name, original, replacement)
        self.on = False

    def add(self, owner: Any, name: str, replacement: Any) -> None:
        self._entries.append((owner, name, getattr(owner, name), replacement))

    def put_on(self) -> None:
        if self.on:
            return
        self.on = True
        for owner, name, original, replacement in self._entries:
            if getattr(owner, name, None) is original:
                setattr(owner, name, replacement)

    def take_off(self) -> None:
        if not self.on:
            return
        self.on = False
        for owner, name, original, replacement in self._entries:
            if getattr(owner, name, None) is replacement:
                setattr(owner, name, original)


class ZeroCodeHook(TorchHook):
    """A TorchHook that finds models, losses and steps by itself."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._stack: list[torch.nn.Module] = []  # the running modules, as the global hooks see them
        super().__init__(*args, **kwargs)
        self._activations.share_stack(self._stack)  # functional activations run in its top module
        self._loss_tensor_ids: set[int] = set()
        self._scaled_losses: dict[int, torch.Tensor] = {}  # id(scaler.scale(loss)) -> loss
        # The global module hooks find roots and losses and capture module I/O. A global hook
        # sends every module call down PyTorch's slow path with two Python calls, so they exist
        # only until a root is found and during saved steps; in between, each root's own
        # pre-hook (or its torch.compile wrapper's) drives the steps.
        self._global_pre_hook = eager(self._global_pre_forward)
        self._global_post_hook = LeftOutOfCopies(eager(self._global_forward))  # global, or a module's
        self._global_handles: list[Any] = []
        self._source_pre_hook = LeftOutOfCopies(eager(self._push_source))
        self._attach_globals()
        self._loss_wrappers = SwappedAttributes()  # on during saved steps
        self._wrappers = SwappedAttributes()  # on from here to close()
        for name in FUNCTIONAL_LOSSES:
            original = getattr(F, name, None)
            if original is not None:
                self._loss_wrappers.add(F, name, self._functional_loss_wrapper(name, original))
        # The tensor backward() starts from: Tensor.backward calls torch.autograd.backward, a
        # module's function. Wrapping that, not the method, keeps torch.Tensor itself unchanged:
        # setting a class attribute invalidates Python's type caches and the specialised code of
        # every attribute read on a tensor (about 70 us spread over the next steps, each time a
        # saved step puts the wrappers on or takes them off). It also sees
        # torch.autograd.backward(loss) called directly.
        self._loss_wrappers.add(torch.autograd, "backward", self._backward_wrapper(torch.autograd.backward))
        self._loss_wrappers.put_on()
        # Mixed precision: backward() runs on scaler.scale(loss), the loss times a scale that
        # changes during training (x2 every 2,000 steps without overflow); captured as it is,
        # that series could rise while the loss falls. The scaled tensor stands for its loss.
        scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler is not None and hasattr(scaler, "scale"):
            self._wrappers.add(scaler, "scale", self._scale_wrapper(scaler.scale))
        # Optimizers as they are created (every subclass's __init__ calls this one): the first
        # forward asks whether one holds the model's parameters, without scanning every object.
        init = torch.optim.Optimizer.__init__
        self._wrappers.add(torch.optim.Optimizer, "__init__", self._optimizer_init_wrapper(init))
        # The groups a script destroys are kept until exit, so that a DDP model still alive then
        # does not take a group's last reference down with the GIL held (torch_process_groups.py)
        self._process_groups = ProcessGroupKeeper()
        distributed = getattr(torch, "distributed", None)
        if distributed is not None and distributed.is_available():
            for owner in (distributed, distributed.distributed_c10d):
                destroy = owner.destroy_process_group
                self._wrappers.add(owner, "destroy_process_group", self._process_groups.wrap(destroy))
        self._wrappers.put_on()

    # -- modules ------------------------------------------------------------------------------
    def _attach_globals(self) -> None:
        if not self._global_handles:
            self._global_handles = [
                register_global_forward_pre_hook(self._global_pre_hook),
                register_global_forward_hook(self._global_post_hook, always_call=True),
            ]

    def _detach_globals(self) -> None:
        handles, self._global_handles = self._global_handles, []
        for handle in handles:
            handle.remove()
        self._stack.clear()  # the post-hooks that would have emptied it will not run

    def _module_io_hooks(self) -> ModuleIOHooks:
        return ZeroCodeModuleIO(self)

    def _push_source(self, module: torch.nn.Module, args: Any) -> None:
        self._stack.append(module)

    _ends_quiet_windows = True

    def _before_possibly_saved_step(self) -> None:
        self._loss_wrappers.put_on()

    def _note_optimizer(self, optimizer: Any, after_another: bool) -> None:
        super()._note_optimizer(optimizer, after_another)
        if self._roots and not self._global_handles and not self._steps_a_root(optimizer):
            # A new optimizer over parameters of no model seen so far: a model trained after the
            # first (a second stage, a fine-tuning head built later). Its forward is found by the
            # global hooks, which exist until the next step that saves nothing begins.
            self._attach_globals()

    def _is_root(self, module: torch.nn.Module) -> bool:
        return id(module) in self._driver.root_hooks or id(module) in self._driver.wrapped_roots

    def _release_hooks(self) -> None:
        super()._release_hooks()
        self._detach_globals()
        self._loss_wrappers.take_off()

    def _global_pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        if not self.enabled:
            if not self._driver.released:
                self._release_hooks()  # capture was disabled: stop costing a call per module
            return
        if is_compile_wrapper(module):
            # The model it wraps runs next, with its own names: that one is the root, and its
            # steps begin at the wrapper, outside the compiled region.
            if not self._stack and id(module._orig_mod) not in self._driver.wrapped_roots:
                self._on_wrapper_found(module, args)
            return
        if not self._stack and not is_loss_module(module) and not self._is_root(module):
            self._on_root_forward(module)
            if not self._global_handles:
                return  # the new root's step saves nothing: the global hooks are gone
        self._stack.append(module)

    @fail_open
    def _on_root_forward(self, module: torch.nn.Module) -> None:
        if not any(reference() is module for reference, _ in self._roots):
            self._name_tree(module)
        self._driver.drive_root(module)
        self.root_forward(module)

    @fail_open
    def _on_wrapper_found(self, wrapper: torch.nn.Module, args: Any) -> None:
        root: torch.nn.Module = wrapper._orig_mod  # type: ignore[assignment]
        if not any(reference() is root for reference, _ in self._roots):
            self._name_tree(root)
        self._driver.drive_from_wrapper(wrapper)
        self._driver.wrapper_pre_forward(wrapper, args)

    def _root_pre_forward_general(self, module: torch.nn.Module, args: Any) -> None:
        active = bool(self._global_handles)
        super()._root_pre_forward_general(module, args)
        if self._global_handles and not active and not isinstance(self._driver.root_hooks.get(id(module)), RootCall):
            # A saved step begins in the root's pre-hook: the global hooks came too late for this
            # root's own call. (Called from its shim instead, the call is yet to start: they see it.)
            self._stack.append(module)

    def _global_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if is_compile_wrapper(module):
            return
        # Keep the stack right even when a forward raised (always_call=True brings us here).
        if self._stack and self._stack[-1] is module:
            self._stack.pop()
        elif module in self._stack:
            del self._stack[len(self._stack) - 1 - self._stack[::-1].index(module) :]
        if self.saving_this_step:
            self._capture(module, args, output)
        if not self._stack and self._activations.active:
            self._activations.stop()  # the root forward is over

    @fail_open
    def _capture(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if any(is_loss_module(parent) for parent in self._stack):
            return  # internals of a loss: the loss module's own output is what counts
        outputs = self.capture_module_io(module, args, output)
        if is_loss_module(module):
            self._loss_tensor_ids.update(id(tensor) for tensor in outputs)
            for tensor in outputs:
                self._step_losses.add(tensor)

    def _on_step_begin(self) -> None:
        self._loss_tensor_ids.clear()
        self._step_losses.clear()
        self._scaled_losses.clear()
        super()._on_step_begin()

    # -- losses without a module --------------------------------------------------------------
    def _functional_loss_wrapper(self, name: str, original: Any) -> Any:
        hook = self
        tensor_name = f"loss_{name}_output_0"

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if hook.saving_this_step and not any(is_loss_module(parent) for parent in hook._stack):
                hook._capture_functional_loss(tensor_name, result, args)
            return result

        return wrapper

    @fail_open
    def _capture_functional_loss(self, tensor_name: str, result: Any, args: tuple[Any, ...]) -> None:
        if isinstance(result, torch.Tensor):
            self.hold_torch_tensor(tensor_name, result)
            self._loss_tensor_ids.add(id(result))
            self._step_losses.add(result)
        # (input, target) of F.cross_entropy & co: what ClassImbalance and Confusion read.
        stem = tensor_name[: -len("_output_0")]
        if not has_class_targets(stem.removeprefix("loss_")):
            return
        for index, collection in enumerate(("predictions", "labels")):
            if index < len(args) and isinstance(args[index], torch.Tensor):
                name = f"{stem}_input_{index}"
                self.add_membership(name, collection)
                self.hold_torch_tensor(name, args[index])

    def _backward_wrapper(self, original: Any) -> Any:
        hook = self

        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if hook.saving_this_step:
                hook._capture_backward_loss(args[0] if args else kwargs.get("tensors"))
            return original(*args, **kwargs)

        return backward

    @fail_open
    def _capture_backward_loss(self, tensors: Any) -> None:
        # torch.autograd.backward takes a tensor or a sequence of them; a loss is one scalar
        if isinstance(tensors, (list, tuple)) and len(tensors) == 1:
            tensors = tensors[0]
        if not isinstance(tensors, torch.Tensor):
            return
        tensor = tensors
        unscaled = self._scaled_losses.get(id(tensor))
        if unscaled is not None:
            tensor = unscaled
        if tensor.numel() == 1 and id(tensor) not in self._loss_tensor_ids:
            self.hold_torch_tensor(BACKWARD_LOSS_NAME, tensor)

    def _optimizer_init_wrapper(self, original: Any) -> Any:
        hook = self
        created = self._created_optimizers

        @functools.wraps(original)
        def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            try:
                created.add(optimizer)
            except TypeError:  # an optimizer class with __slots__ and no __weakref__: found by a scan
                pass
            # A new object: anything noted under its id was a freed optimizer's, whose memory it
            # reuses (else its first step reads as the old one's second with no forward seen)
            hook._optimizer_parameters.pop(id(optimizer), None)
            hook._stepping_optimizers.pop(id(optimizer), None)
            if hook._signalling is not None:
                hook._stop_signalling()  # its steps must reach the post-hook: it may train a new model

        return __init__

    def _scale_wrapper(self, original: Any) -> Any:
        hook = self

        @functools.wraps(original)
        def scale(scaler: Any, outputs: Any) -> Any:
            result = original(scaler, outputs)
            if hook.saving_this_step and isinstance(outputs, torch.Tensor) and isinstance(result, torch.Tensor):
                hook._scaled_losses[id(result)] = outputs  # kept alive with it until the step ends
            return result

        return scale

    def close(self) -> None:
        self._loss_wrappers.take_off()
        self._wrappers.take_off()
        super().close()
        self._detach_globals()


class ZeroCodeModuleIO(ModuleIOHooks):
    """The zero-code hook's saved-step module hooks: its global hooks capture every module, and
    the functional losses' wrappers are on, while a step saves."""

    __slots__ = ("_hook",)

    def __init__(self, hook: ZeroCodeHook) -> None:
        super().__init__(hook, hook._saver, hook._forward_hook, hook._registered_roots, hook._loss_modules)
        self._hook = hook

    def attach(self) -> None:
        super().attach()
        self._hook._loss_wrappers.put_on()
        if self.narrow is None:
            self._hook._attach_globals()

    def hook_source(self, module: torch.nn.Module) -> None:
        # What the global hooks would do for this module alone: keep it on the stack (a
        # functional loss inside a loss module is that module's) and capture its I/O.
        hook = self._hook
        self.handles.append(module.register_forward_pre_hook(hook._source_pre_hook))
        self.handles.append(module.register_forward_hook(hook._global_post_hook, always_call=True))

    def detach(self) -> None:
        super().detach()
        hook = self._hook
        if hook._roots:  # until a root is found, the global hooks are how one is found
            hook._detach_globals()
            if hook._quiet.left:
                # Off while steps are certainly unsaved; back on at the last of them: in
                # ``F.cross_entropy(model(x), y)`` the function is looked up before the forward
                # that begins a saved step runs (_before_possibly_saved_step).
                hook._loss_wrappers.take_off()
