"""Zero code change for Keras 3 scripts under ``trainguard run``.

Armed by :mod:`trainguard.zero_code` right after the script's own ``import keras`` completes.
On the torch and JAX backends, ``keras.Model.fit``/``evaluate``/``predict`` (inherited by every
model) are wrapped so that each call gets the process's one :class:`KerasHook` among its
callbacks, unless the script passed a KerasHook of its own. The hook is created at the first
such call (a script that only imports Keras writes nothing) from the same environment as
PyTorch's zero-code hook: out_dir, DebugHookConfig, save interval. The overhead budget is not
applied to Keras (its hook keeps the schedule as given).

The TensorFlow backend is refused in one line at import: its hook would capture weights and
losses but no gradients or layer outputs, and the rules would judge the run from half the data
(a dead-ReLU model read as a too-low learning rate).
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

import keras

from trainguard.config.capture_config import CaptureConfig
from trainguard.hooks.keras_capture import BACKEND

__all__ = ["SUPPORTED_BACKENDS", "KerasZeroCode", "unsupported_backend_message"]

logger = logging.getLogger("trainguard")

SUPPORTED_BACKENDS = ("torch", "jax")
_WRAPPED_METHODS = ("fit", "evaluate", "predict")


def unsupported_backend_message(backend: str) -> str:
    return (
        f"trainguard: Keras's {backend} backend is not captured (no gradients or layer outputs): "
        "run with KERAS_BACKEND=torch or KERAS_BACKEND=jax"
    )


class KerasZeroCode:
    """Puts one zero-code KerasHook into every ``fit``/``evaluate``/``predict`` of the process."""

    def __init__(self, capture_config: Callable[[], CaptureConfig], backend: str = BACKEND) -> None:
        self._capture_config = capture_config  # called once, at the first fit/evaluate/predict
        self.backend = backend
        self.hook: Any = None
        self._failed = False
        self._originals: dict[str, Any] = {}

    def arm(self) -> bool:
        """Wrap the Model methods; False (and one line on the log) for a backend not captured."""
        if self.backend not in SUPPORTED_BACKENDS:
            logger.warning(unsupported_backend_message(self.backend))
            return False
        for name in _WRAPPED_METHODS:
            original = getattr(keras.Model, name)
            self._originals[name] = original
            setattr(keras.Model, name, self._wrap(original))
        atexit.register(self.report_unused)
        return True

    def report_unused(self) -> None:
        """At exit: one line when Keras was imported but nothing went through fit/evaluate/predict
        (a custom training loop, ``train_on_batch``), so that the run does not end silently empty."""
        if self._originals and self.hook is None and not self._failed:
            logger.warning(
                "trainguard: Keras was imported but no Model.fit/evaluate/predict ran: nothing was captured "
                "from Keras (a custom training loop needs trainguard.keras.KerasHook callbacks or hook calls)"
            )

    def disarm(self) -> None:
        for name, original in self._originals.items():
            setattr(keras.Model, name, original)
        self._originals.clear()
        atexit.unregister(self.report_unused)

    def _wrap(self, original: Any) -> Any:
        signature = inspect.signature(original)
        zero_code = self

        @functools.wraps(original)
        def method(model: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                args, kwargs = zero_code._with_hook(model, signature, args, kwargs)
            except Exception as error:  # noqa: BLE001 - fail open: the call runs without capture
                zero_code._give_up(error)
            return original(model, *args, **kwargs)

        return method

    def _with_hook(
        self, model: Any, signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        bound = signature.bind(model, *args, **kwargs)
        callbacks = bound.arguments.get("callbacks")
        members = list(getattr(callbacks, "callbacks", callbacks) or [])
        from trainguard.hooks.keras import KerasHook

        if any(isinstance(callback, KerasHook) for callback in members):
            return args, kwargs  # the script captures by itself
        hook = self._hook()
        if hook is None or not hook.enabled:
            return args, kwargs
        if isinstance(callbacks, keras.callbacks.CallbackList):
            if hook not in callbacks.callbacks:
                hook.set_model(model)
                callbacks.append(hook)
            return args, kwargs
        bound.arguments["callbacks"] = [*members, hook]
        return tuple(bound.args[1:]), dict(bound.kwargs)

    def _hook(self) -> Any:
        if self.hook is None and not self._failed:
            from trainguard.hooks.keras import KerasHook

            self.hook = KerasHook(config=self._capture_config())
        return self.hook

    def _give_up(self, error: BaseException) -> None:
        from trainguard.hooks.fail_open import log_disabled

        self._failed = True
        if self.hook is not None:
            self.hook.disable(error)
        log_disabled("Keras zero-code capture", error)
