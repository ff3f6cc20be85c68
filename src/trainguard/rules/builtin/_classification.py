"""Shared pieces of ClassImbalance and Confusion: finding labels and predictions, class ids.

PyTorch runs: the hook puts a loss module's input 0 (the model's output) in collection
``predictions`` and input 1 (the target) in ``labels`` (``CrossEntropyLoss_input_0``/``_1``).
XGBoost runs: ``labels`` and ``predictions`` tensors of those collections. Other runs: by regex.

Class ids from saved tensors (:func:`class_ids`):

* predictions with one axis more than the labels are scores (logits/probabilities): argmax
  over the class axis, axis 1 (PyTorch's layout: ``N×C`` or ``N×C×H×W``); ``argmax=True``
  forces this even for equal ranks (then the class axis is the last);
* labels of the same shape as ≥2-D predictions whose values sum to 1 over axis 1 are one-hot or
  probability targets: both are argmaxed (other same-shape 0/1 labels are multi-label targets);
* 1-D float predictions next to 0/1 labels are binary scores: logits (any value outside
  [0, 1]) are thresholded at 0, probabilities at 0.5;
* everything else is rounded to integers. Negative labels (``ignore_index=-100``) and
  non-finite values are dropped, with their prediction.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["class_ids", "default_start_step", "label_prediction_pairs", "regex_problem"]

DEEP_LEARNING_WARMUP_STEPS = 100
XGBOOST_WARMUP_ROUNDS = 10


def default_start_step(trial: Any) -> int:
    """Steps before an untrained model's predictions stop counting: 100 training steps, or 10
    boosting rounds in XGBoost runs (told by their ``trees``/``feature_importance`` tensors),
    where one step is a whole tree and round 0 already predicts far better than chance."""
    known = trial.collections()
    for collection in ("trees", "feature_importance"):
        if collection in known and trial.tensor_names(collection=collection):
            return XGBOOST_WARMUP_ROUNDS
    return DEEP_LEARNING_WARMUP_STEPS


def regex_problem(value: str) -> str | None:
    """A Param check: why ``value`` is not a valid regular expression, or None."""
    try:
        re.compile(value)
    except re.error as error:
        return f"not a valid regular expression: {error}"
    return None


def _names(trial: Any, step: int, regexes: Sequence[str], collections: Sequence[str]) -> list[str]:
    found: set[str] = set()
    known = trial.collections()
    for collection in collections:
        if collection and collection in known:
            found.update(trial.tensor_names(step=step, collection=collection))
    patterns = [pattern for pattern in regexes if pattern]
    if patterns:
        found.update(trial.tensor_names(step=step, regex=patterns))
    return sorted(found)


def _stem(name: str) -> str:
    for suffix in ("_input_0", "_input_1"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def label_prediction_pairs(
    trial: Any,
    step: int,
    *,
    label_regexes: Sequence[str],
    prediction_regexes: Sequence[str],
    label_collections: Sequence[str],
    prediction_collections: Sequence[str],
) -> list[tuple[str, str]]:
    """(labels, predictions) tensor names saved at ``step``, each label paired with one prediction.

    A label pairs with the prediction sharing its longest common prefix (``CrossEntropyLoss_input_1``
    with ``CrossEntropyLoss_input_0``); the same tensor may be both.
    """
    labels = _names(trial, step, label_regexes, label_collections)
    predictions = _names(trial, step, prediction_regexes, prediction_collections)
    if not labels or not predictions:
        return []
    pairs = []
    for label in labels:
        stem = _stem(label)
        best = max(predictions, key=lambda name: (_stem(name) == stem, len(os.path.commonprefix([name, label]))))
        pairs.append((label, best))
    return pairs


def class_ids(labels: Any, predictions: Any, *, argmax: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
    """Flat integer (labels, predicted classes) of equal length, or None when they cannot be paired."""
    y = np.asarray(labels)
    p = np.asarray(predictions)
    if y.dtype.kind not in "fiub" or p.dtype.kind not in "fiub" or y.size == 0 or p.size == 0:
        return None
    with np.errstate(all="ignore"):
        y = np.atleast_1d(y.astype(np.float64))
        p = np.atleast_1d(p.astype(np.float64))
        if y.size == 1 and p.ndim == 1 and p.size > 1:
            p = p.reshape(1, -1)  # one sample's class scores
        if p.ndim == y.ndim + 1 and p.shape[0] == y.shape[0]:
            p = _argmax(p, axis=1)
        elif argmax and p.ndim >= 2 and p.shape != y.shape:
            p = _argmax(p, axis=-1)
        elif p.ndim >= 2 and p.shape == y.shape and (argmax or _rows_sum_to_one(y)):
            # one-hot or probability targets next to per-class scores
            y = _argmax(y, axis=1)
            p = _argmax(p, axis=1)
        elif p.shape == y.shape and not _integral(p) and _is_binary(y):
            finite = p[np.isfinite(p)]
            logits = finite.size > 0 and (finite.min() < 0 or finite.max() > 1)
            p = (p > (0.0 if logits else 0.5)).astype(np.float64)
        if not _integral(y):
            return None  # regression targets or soft labels: not class ids
        y = y.reshape(-1)
        p = p.reshape(-1)
        if y.size != p.size:
            return None
        keep = np.isfinite(y) & np.isfinite(p) & (y >= 0)
        return np.rint(y[keep]).astype(np.int64), np.rint(np.clip(p[keep], 0, None)).astype(np.int64)


def _argmax(array: np.ndarray, axis: int) -> np.ndarray:
    """argmax that treats NaN as smallest (numpy's argmax would pick the first NaN)."""
    if array.shape[axis] == 0:
        return np.full(np.delete(array.shape, axis), np.nan)
    cleaned = np.where(np.isnan(array), -np.inf, array)
    result = np.argmax(cleaned, axis=axis).astype(np.float64)
    all_nan = np.all(np.isnan(array), axis=axis)
    result[all_nan] = np.nan
    return result


def _rows_sum_to_one(array: np.ndarray) -> bool:
    """One-hot or probability targets (each sample's values along the class axis sum to 1)."""
    sums = np.sum(array, axis=1)
    return bool(np.all(np.isfinite(sums)) and np.allclose(sums, 1.0, atol=1e-3))


def _integral(array: np.ndarray) -> bool:
    finite = array[np.isfinite(array)]
    return bool(np.all(finite == np.rint(finite)))


def _is_binary(array: np.ndarray) -> bool:
    finite = array[np.isfinite(array)]
    return finite.size > 0 and bool(np.all((finite == 0) | (finite == 1)))
