"""Synthetic runs whose mode steps are the hook's, not consecutive numbers.

``tests.rules.synthetic.write_run`` numbers the saved steps of each mode 0, 1, 2, ...; a hook
saving every 4th step numbers them 0, 4, 8, ... The loss rules count ``num_steps`` in mode
steps, so their vectors need the hook's numbering: here each step's mode step is the number of
steps of that mode before it *including unsaved ones*, i.e. for a run of one mode, the global
step itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from trainguard.config.collections import CollectionManager
from trainguard.format.layout import END_OF_TRAINING, collections_key, worker_name
from trainguard.modes import ModeKeys
from trainguard.storage import open_store
from trainguard.writer.thread import StepWriter


def write_single_mode_run(
    path: str | os.PathLike[str],
    steps: Mapping[int, Mapping[str, Any]],
    *,
    mode: ModeKeys | str = ModeKeys.TRAIN,
    collections: Mapping[str, Iterable[str]] | None = None,
) -> str:
    """Write ``{global step: {name: value}}``, all in ``mode``, with mode step == global step."""
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    manager = CollectionManager.pytorch_defaults()
    for collection, names in (collections or {}).items():
        for name in names:
            manager.get(collection).add_tensor_name(name)
    writer = StepWriter(open_store(path), worker_name(0))
    writer.write_object(collections_key(worker_name(0)), manager.render(1))
    for step in sorted(steps):
        writer.begin_step(int(step), ModeKeys.parse(mode), int(step))
        for name, value in steps[step].items():
            array = np.asarray(value, dtype=np.float64).reshape(-1) if np.ndim(value) == 0 else np.asarray(value)
            writer.add_tensor(name, array, nbytes=array.nbytes)
        writer.end_step()
    writer.write_object(END_OF_TRAINING, b"")
    if not writer.close(timeout=60) or writer.failure is not None:
        raise RuntimeError(f"synthetic run {path}: the writer failed: {writer.failure}")
    return path
