"""The data a run's model was fed, for the data rules (NotNormalizedData, CheckInputImages, ClassImbalance).

:func:`~trainguard.rules.builtin._helpers.model_inputs` finds the model's input tensors by name
and collection; the PyTorch hook also files root inputs it found not to be data in collection
``derived_inputs`` (hooks/torch_data_identity.py: a recurrent state fed back into the model, one
model's output fed to another, a tensor with autograd history such as the pre-activation a
directly called layer passes to its first child). Those are never data, whatever their name.
"""

from __future__ import annotations

from typing import Any

from trainguard.rules.builtin._helpers import model_inputs

__all__ = ["DERIVED_INPUTS", "data_inputs", "derived_inputs"]

DERIVED_INPUTS = "derived_inputs"  # the hook's collection (hooks/torch_data_identity.py)


def derived_inputs(trial: Any) -> frozenset[str]:
    """The input names the hook found not to be data (the collection as the run last wrote it)."""
    if DERIVED_INPUTS not in trial.collections():
        return frozenset()
    return frozenset(trial.tensor_names(collection=DERIVED_INPUTS))


def data_inputs(trial: Any, step: int) -> list[str]:
    """The model's inputs saved at ``step`` that are data."""
    names = model_inputs(trial, step)
    derived = derived_inputs(trial) if names else frozenset()
    return [name for name in names if name not in derived]
