"""Write small synthetic runs for rule tests: ``{step: {tensor name: array}}`` → a real run on disk.

The run is written with the hook's own :class:`~trainguard.writer.thread.StepWriter` (the real
event/index/collections format a trial reads), so a rule sees exactly what a training job's
hook would produce, with step numbers, modes and collection memberships chosen by the test.

    from tests.rules.synthetic import write_run, evaluate_rule
    path = write_run(tmp_path / "run", {0: {"gradient/w": np.zeros(3)}}, collections={"gradients": ["gradient/w"]})
    results = evaluate_rule(path, "VanishingGradient")

API (kept stable; other rule tests import it):

* :func:`write_run` (path, steps, *, modes=None, collections=None, finished=True) -> str
* :func:`open_trial` (path) -> Trial
* :func:`evaluate_rule` (path_or_trial, spec, *, steps=None, start=None, end=None, other_trials=()) -> list[StepResult]
* :func:`first_firing` (results) -> int | None
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from trainguard.config.collections import CollectionManager
from trainguard.format.layout import END_OF_TRAINING, collections_key, worker_name
from trainguard.modes import ModeKeys
from trainguard.rules import RuleSpec, StepResult, create_rule
from trainguard.storage import open_store
from trainguard.trial import create_trial
from trainguard.writer.thread import StepWriter

__all__ = ["evaluate_rule", "first_firing", "open_trial", "write_run"]

ModeLike = ModeKeys | str | int


def write_run(
    path: str | os.PathLike[str],
    steps: Mapping[int, Mapping[str, Any]],
    *,
    modes: Mapping[int, ModeLike] | ModeLike | None = None,
    collections: Mapping[str, Iterable[str]] | None = None,
    finished: bool = True,
    mode_steps: Mapping[int, int] | None = None,
) -> str:
    """Write ``steps`` ({global step: {name: array or number}}) as a run at ``path``.

    Args:
        modes: the mode of each global step (a mapping), or one mode for all steps; default
            TRAIN. Mode steps are counted per mode in global-step order, as a hook does.
        collections: {collection name: tensor names} memberships written to the collections
            file, on top of the PyTorch default collections (whose regexes also apply).
        finished: write the end-of-training marker (False leaves a "live" run).
        mode_steps: the mode step of each global step, where the run did not save every step
            (a hook counts the steps it did not save too); default: counted over ``steps``.

    Returns:
        The run's path as a string (what ``create_trial`` takes).
    """
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    manager = CollectionManager.pytorch_defaults()
    for collection, names in (collections or {}).items():
        group = manager.get(collection)
        for name in names:
            group.add_tensor_name(name)
    worker = worker_name(0)
    writer = StepWriter(open_store(path), worker)
    writer.write_object(collections_key(worker), manager.render(1))
    counted: dict[ModeKeys, int] = {}
    for step in sorted(steps):
        mode = _mode_of(modes, step)
        counted[mode] = counted.get(mode, -1) + 1
        mode_step = counted[mode] if mode_steps is None else mode_steps[step]
        writer.begin_step(int(step), mode, mode_step)
        for name, value in steps[step].items():
            array = np.asarray(value)
            if array.ndim == 0:
                array = array.reshape(1)
            writer.add_tensor(name, array, nbytes=array.nbytes)
        writer.end_step()
    if finished:
        writer.write_object(END_OF_TRAINING, b"")
    if not writer.close(timeout=60):
        raise RuntimeError(f"synthetic run {path}: the writer did not finish within 60 s")
    if writer.failure is not None:
        raise RuntimeError(f"synthetic run {path}: writer failed: {writer.failure}")
    return path


def _mode_of(modes: Mapping[int, ModeLike] | ModeLike | None, step: int) -> ModeKeys:
    if modes is None:
        return ModeKeys.TRAIN
    if isinstance(modes, Mapping):
        return ModeKeys.parse(modes.get(step, ModeKeys.TRAIN))
    return ModeKeys.parse(modes)


def open_trial(path: str | os.PathLike[str]) -> Any:
    return create_trial(os.fspath(path), collection_wait_timeout=5)


def evaluate_rule(
    run: Any,
    spec: RuleSpec | str,
    *,
    steps: Iterable[int] | None = None,
    start: int | None = None,
    end: int | None = None,
    other_trials: Iterable[Any] = (),
    finish: bool = True,
) -> list[StepResult]:
    """Evaluate a rule on every complete step of a run (or ``steps``, or ``start <= s < end``).

    ``run`` is a path or a trial. Returns every non-None result in step order, plus the
    result of ``finish()`` when it returns one.
    """
    trial = open_trial(run) if isinstance(run, (str, os.PathLike)) else run
    rule = create_rule(trial, spec, other_trials=list(other_trials))
    chosen = list(steps) if steps is not None else trial.steps()
    chosen = [s for s in chosen if (start is None or s >= start) and (end is None or s < end)]
    results = [result for step in chosen if (result := rule.evaluate(step)) is not None]
    if finish:
        final = rule.finish()
        if final is not None:
            results.append(final)
    return results


def first_firing(results: Iterable[StepResult]) -> int | None:
    """The step of the first result that fired, or None."""
    return next((result.step for result in results if result.fired), None)
