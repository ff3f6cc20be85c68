"""Arming the zero-code hook in a process started by ``trainguard run``.

Configuration comes from the environment that ``trainguard run`` sets (read when arming, never
at import): ``TRAINGUARD_ZERO_CODE=1`` and ``TRAINGUARD_CAPTURE``, the run's whole
:class:`~trainguard.config.capture_config.CaptureConfig` as one JSON value. A container that arms
the hook by hand may set ``TRAINGUARD_OUT_DIR``, ``TRAINGUARD_CONFIG`` (a DebugHookConfig JSON),
``TRAINGUARD_SAVE_INTERVAL``, ``TRAINGUARD_OVERHEAD_BUDGET`` and
``TRAINGUARD_OVERHEAD_MAX_INTERVAL`` instead.

PyTorch scripts are captured by ``hooks/zero_code.py`` once they import torch; Keras 3 scripts by
``hooks/keras_zero_code.py`` once they import keras (its torch backend's layers are left to it).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainguard.config.capture_config import CaptureConfig

__all__ = ["DEFAULT_OVERHEAD_BUDGET", "arm_from_environment", "capture_config"]

logger = logging.getLogger("trainguard")
# The capture's default share of training time under ``trainguard run`` (1 %): the budget counts
# what it can measure (the training thread's extra time on saved steps, the writer's CPU); the
# rest (the hook's per-step checks, cache effects on later steps) must fit in the 5 % users accept.
# On a fast step that unaccounted rest is about as large as what the budget counts
# (bench/real_stacks.py shows both), so the budget is kept well below the 5 % to leave it room.
DEFAULT_OVERHEAD_BUDGET = 0.01
_installed: list[Any] = []
_profilers: list[Any] = []
# Keras under zero-code capture: Keras 3 on the torch backend runs its layers as torch modules,
# which PyTorch's zero-code hook must not take for the script's model (it cannot read their
# meta-device parameters, and Keras's own steps are no torch optimizer steps): the Keras hook
# captures them. "importing": Keras's import is under way (torch imported by it waits for it).
_keras: dict[str, Any] = {"importing": False, "torch_waiting": False, "zero_code": None}


def capture_config(environ: Mapping[str, str], *, drop_unknown_collections: bool = True) -> CaptureConfig:
    """The zero-code hook's capture config from the environment (see
    :meth:`CaptureConfig.from_environment`), checked as the hook will check it; raises
    ConfigError. An unknown collection in a hook config is dropped with a warning (training has
    started: fail open) unless ``drop_unknown_collections=False`` (``trainguard run`` checking
    before training)."""
    from trainguard.config.capture_config import CaptureConfig

    config = CaptureConfig.from_environment(environ, drop_unknown_collections=drop_unknown_collections)
    _check_with_a_dry_run(config)
    return config


def _check_with_a_dry_run(config: CaptureConfig) -> None:
    """Reject now what the hook would reject when the script imports torch (unknown collections,
    a writer kind...): ``trainguard run`` must fail before the script starts, not leave it running
    uncaptured. A framework-free dry-run hook does the checking."""
    from trainguard.hooks.base import BaseHook

    BaseHook(config=config, dry_run=True).close()


def install_now() -> None:
    """Create the process's zero-code hook (torch must be importable)."""
    if _installed:
        return
    if _keras["importing"]:
        _keras["torch_waiting"] = True  # Keras imports torch: its backend decides (_arm_keras)
        return
    from trainguard.hooks.zero_code import ZeroCodeHook

    _installed.append(ZeroCodeHook(config=capture_config(os.environ)))



def yield_to_scripts_hook(hook: Any) -> None:
    """The script made a PyTorch hook of its own (``trainguard.pytorch.Hook``) while zero-code
    capture is armed. Into another directory, both capture. Into the zero-code hook's own, two
    hooks would write the same step files over each other (each its own schedule and steps): the
    zero-code hook, if it captured nothing yet, stands aside, and the script's hook, its schedule
    and collections, make the run; if it already captured, the script's hook is disabled
    instead. Fails open."""
    zero_code = _installed[0] if _installed else None
    if zero_code is None or zero_code is hook or not _same_place(zero_code.out_dir, hook.out_dir):
        return
    try:
        if zero_code._roots or zero_code._writer is not None:
            hook.enabled = False
            logger.warning("trainguard: a Hook made after zero-code capture began writing to %s captures nothing "
                           "(the two would write over each other's steps)", hook.out_dir)  # fmt: skip
            return
        zero_code.close()
        logger.info("trainguard: the script's own Hook writes to %s: its collections and schedule make the "
                    "run, zero-code capture stands aside", hook.out_dir)  # fmt: skip
    except Exception as error:  # noqa: BLE001 - fail open: the script must still run
        from trainguard.hooks.fail_open import log_disabled

        log_disabled("standing aside for the script's hook", error)


def _same_place(first: Any, second: Any) -> bool:
    if not first or not second:
        return False
    first, second = str(first), str(second)
    if "://" in first or "://" in second:
        return first.rstrip("/") == second.rstrip("/")
    return os.path.realpath(first) == os.path.realpath(second)

class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` right after the script's own ``import <name>`` completes (fail open:
    an error is one log line naming ``what``); ``flag``, when given, is set in ``_keras`` while the
    import runs."""

    def __init__(self, name: str, then: Callable[[ModuleType], None], what: str, flag: str | None = None) -> None:
        self._name, self._then, self._what, self._flag = name, then, what, flag

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        original_exec = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            if self._flag:
                _keras[self._flag] = True
            try:
                original_exec(module)
            finally:
                if self._flag:
                    _keras[self._flag] = False
            try:
                self._then(module)
            except Exception as error:  # noqa: BLE001 - fail open: the script must still run
                from trainguard.hooks.fail_open import log_disabled

                log_disabled(self._what, error)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _after_torch_import(torch: ModuleType) -> None:
    for profiler in _profilers:
        profiler.attach_framework()  # fail-open inside
    install_now()


def _arm_keras(keras: ModuleType) -> None:
    """Capture Keras through its hook (hooks/keras_zero_code.py); keep PyTorch's zero-code hook
    off Keras's torch modules."""
    backend = keras.backend.backend()
    waiting, _keras["torch_waiting"] = _keras["torch_waiting"], False
    if backend == "torch":
        torch_hook = _installed[0] if _installed else None
        if torch_hook is not None and (torch_hook._roots or torch_hook._writer is not None):
            logger.warning(
                "trainguard: PyTorch capture began before Keras was imported; Keras's fit is not captured "
                "(pass trainguard.keras.KerasHook(...) in callbacks=[...] to capture it)"
            )
            return
        if torch_hook is not None:
            torch_hook.close()  # nothing captured yet: no file written, its hooks taken off
        else:
            _installed.append(None)  # torch's own import comes later or came with Keras: not installed
    elif waiting:
        install_now()  # torch came with Keras, but the models are JAX's: torch scripts still captured
    from trainguard.hooks.keras_zero_code import KerasZeroCode

    zero_code = KerasZeroCode(lambda: capture_config(os.environ), backend=backend)
    if zero_code.arm():
        _keras["zero_code"] = zero_code


def _start_profiler() -> None:
    """TRAINGUARD_PROFILER=1: system metrics from now on, PyTorch step timings once torch is
    imported; under ``<TRAINGUARD_OUT_DIR>/profiler-output``. Fails open."""
    if os.environ.get("TRAINGUARD_PROFILER") != "1":
        return  # not asked for: the profiler's modules (numpy among them) stay unloaded
    try:
        from trainguard.profiler import start_from_environment

        profiler = start_from_environment()
    except Exception as error:  # noqa: BLE001 - fail open: the script must still run
        logger.warning("trainguard: profiler not started (%s: %s); training continues", type(error).__name__, error)
        return
    if profiler is not None:
        _profilers.append(profiler)


def _is_launcher() -> bool:
    """torchrun's agent (``torchrun ...``, ``python -m torch.distributed.run|launch ...``): it
    starts the ranks and trains nothing; each rank arms its own hook. Armed, it imported torch
    and started a writer process ahead for nothing, and closed that hook at its exit, after the
    ranks had ended: time added to every distributed run's end."""
    argv = list(getattr(sys, "orig_argv", []))[1:]  # after the interpreter: its options, then the program
    while argv and argv[0].startswith("-") and argv[0] not in ("-m", "-c"):
        argv.pop(0)
    if len(argv) >= 2 and argv[0] == "-m":
        return argv[1] in ("torch.distributed.run", "torch.distributed.launch")
    return bool(argv) and os.path.basename(argv[0]) == "torchrun"


def arm_from_environment() -> None:
    if os.environ.get("TRAINGUARD_ZERO_CODE") != "1" or _is_launcher():
        return
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    _start_profiler()
    if "keras" in sys.modules:
        _arm_keras(sys.modules["keras"])
    else:
        sys.meta_path.insert(0, _AfterImport("keras", _arm_keras, "Keras zero-code capture", flag="importing"))
    if "torch" in sys.modules:
        install_now()
    else:
        sys.meta_path.insert(0, _AfterImport("torch", _after_torch_import, "zero-code capture"))
