"""Zero code change: capture a stock PyTorch script through PyTorch's own global hooks.

Nothing in the user's script or in PyTorch is edited. Installed once per process (by the
``sitecustomize`` that ``trainguard run`` puts on ``PYTHONPATH``), the hook watches:

* every module forward (``register_module_forward_pre_hook``/``register_module_forward_hook``):
  a forward that starts with no other module running is a *root* forward; its module tree is
  named as smdebug names it and its parameters get gradient hooks. Loss modules (class name
  ending in ``Loss``) are losses, never roots.
* every optimizer step (``register_optimizer_step_post_hook``): the end of a TRAIN step.
* functional losses (``torch.nn.functional.cross_entropy`` & co) and ``Tensor.backward``: the
  tensor a backward starts from is the step's loss even when no loss module exists. These two
  are wrapped, not edited, and restored by :meth:`close`.

TRAIN and EVAL are told apart by ``module.training`` and ``torch.is_grad_enabled()``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from trainguard.hooks.fail_open import fail_open
from trainguard.hooks.pytorch import TorchHook, eager, is_loss_module

__all__ = ["FUNCTIONAL_LOSSES", "ZeroCodeHook"]

FUNCTIONAL_LOSSES = (
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "poisson_nll_loss",
    "gaussian_nll_loss", "cosine_embedding_loss", "margin_ranking_loss", "hinge_embedding_loss",
    "soft_margin_loss", "multilabel_soft_margin_loss", "multilabel_margin_loss", "multi_margin_loss",
    "triplet_margin_loss", "ctc_loss",
)  # fmt: skip
BACKWARD_LOSS_NAME = "loss_backward_output_0"


def _is_compile_wrapper(module: torch.nn.Module) -> bool:
    """``torch.compile(model)``'s wrapper (by name: no import of torch._dynamo for the check)."""
    return type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod")


class ZeroCodeHook(TorchHook):
    """A TorchHook that finds models, losses and steps by itself."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stack: list[torch.nn.Module] = []
        self._loss_tensor_ids: set[int] = set()
        self._handles.append(register_module_forward_pre_hook(eager(self._global_pre_forward)))
        self._handles.append(register_module_forward_hook(eager(self._global_forward), always_call=True))
        self._originals: list[tuple[Any, str, Any]] = []
        for name in FUNCTIONAL_LOSSES:
            original = getattr(F, name, None)
            if original is not None:
                self._wrap(F, name, self._functional_loss_wrapper(name, original))
        self._wrap(torch.Tensor, "backward", self._backward_wrapper(torch.Tensor.backward))

    def _wrap(self, owner: Any, name: str, replacement: Any) -> None:
        self._originals.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    # -- modules ------------------------------------------------------------------------------
    def _global_pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        if _is_compile_wrapper(module):
            return  # the model it wraps runs next, with its own names: that one is the root
        if not self._stack and not is_loss_module(module):
            self._on_root_forward(module)
        self._stack.append(module)

    @fail_open
    def _on_root_forward(self, module: torch.nn.Module) -> None:
        if not any(reference() is module for reference, _ in self._roots):
            self._name_tree(module)
        self.root_forward(module)

    def _global_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if _is_compile_wrapper(module):
            return
        # Keep the stack right even when a forward raised (always_call=True brings us here).
        if self._stack and self._stack[-1] is module:
            self._stack.pop()
        elif module in self._stack:
            del self._stack[len(self._stack) - 1 - self._stack[::-1].index(module) :]
        if self.saving_this_step:
            self._capture(module, args, output)
        if not self._stack and self._activation_mode is not None:
            self._stop_activation_capture()  # the root forward is over

    @fail_open
    def _capture(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if any(is_loss_module(parent) for parent in self._stack):
            return  # internals of a loss: the loss module's own output is what counts
        outputs = self.capture_module_io(module, args, output)
        if is_loss_module(module):
            self._loss_tensor_ids.update(id(tensor) for tensor in outputs)

    # -- functional activations: this hook's own module stack says where they run ------------
    def _track_module_stack(self) -> None:
        pass

    def _current_module(self) -> torch.nn.Module | None:
        return self._stack[-1] if self._stack else self._activation_root

    def _on_step_begin(self) -> None:
        self._loss_tensor_ids.clear()
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
        # (input, target) of F.cross_entropy & co: what ClassImbalance and Confusion read.
        stem = tensor_name[: -len("_output_0")]
        for index, collection in enumerate(("predictions", "labels")):
            if index < len(args) and isinstance(args[index], torch.Tensor):
                name = f"{stem}_input_{index}"
                self.add_membership(name, collection)
                self.hold_torch_tensor(name, args[index])

    def _backward_wrapper(self, original: Any) -> Any:
        hook = self

        @functools.wraps(original)
        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if hook.saving_this_step:
                hook._capture_backward_loss(tensor)
            return original(tensor, *args, **kwargs)

        return backward

    @fail_open
    def _capture_backward_loss(self, tensor: torch.Tensor) -> None:
        if tensor.numel() == 1 and id(tensor) not in self._loss_tensor_ids:
            self.hold_torch_tensor(BACKWARD_LOSS_NAME, tensor)

    def close(self) -> None:
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)
        self._originals.clear()
        super().close()
