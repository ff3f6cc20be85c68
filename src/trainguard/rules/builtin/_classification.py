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

Targets that are not class labels (:func:`vocabulary_targets`): a language model's next tokens,
and per-token targets over a vocabulary, are frequencies of words, not classes someone sampled;
a rare successor word mispredicted 97 % of the time is no class imbalance. Such targets are

* the model's token ids shifted by one position (next-token prediction: ``targets =
  tokens[1:]``, batch-first or sequence-first, flattened or not, shifted outside the model or
  inside it as Hugging Face models do), every label that is not ignored (< 0) equal; or
* one target per input token with the scores over at least as many classes as the input's
  largest token id + 1 (the output space covers the input's vocabulary: a masked language
  model); a tagger's few tags for many-word inputs are classes; or, with no token ids seen,
* targets with one sequence axis fed to cross-entropy with the class axis 1 (``N×V×T`` scores
  for ``N×T`` targets, PyTorch's layout for per-position targets) over more classes than
  ``VOCABULARY_MIN_CLASSES``; a segmentation's ``N×H×W`` targets have two spatial axes.

A tagger over a vocabulary of fewer than its tag count, or a sequence labeller fed float
features with many classes, cannot be told from these by shapes: the first is judged as
classes, the second as per-token targets.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from trainguard.rules.builtin._data_inputs import data_inputs
from trainguard.rules.builtin._losses import read_values

__all__ = ["class_count", "class_ids", "default_start_step", "label_prediction_pairs", "per_token_reason",
           "regex_problem", "token_inputs", "vocabulary_targets"]

DEEP_LEARNING_WARMUP_STEPS = 100
XGBOOST_WARMUP_ROUNDS = 10
# With no token ids to compare, per-position targets over at least this many classes read as a
# vocabulary (the third criterion of the module docstring): a sequence labeller's tag sets are
# tens (BIO NER tags 9, Penn POS tags 45), word vocabularies thousands.
VOCABULARY_MIN_CLASSES = 100


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


def class_count(labels: Any, predictions: Any) -> int | None:
    """How many classes the predictions score: the size of their class axis (one axis more than
    the labels: axis 1); None when there is none (one score per binary label, regression)."""
    y, p = np.asarray(labels), np.asarray(predictions)
    if p.ndim == y.ndim + 1 and p.ndim >= 2 and p.shape[0] == (y.shape[0] if y.ndim else 1):
        return int(p.shape[1])
    if p.ndim == 2 and y.ndim == 0:
        return int(p.shape[1])
    return None


def vocabulary_targets(labels: Any, predictions: Any, tokens: Sequence[Any]) -> bool:
    """Whether ``labels`` are next-token or per-token targets over a vocabulary, not class labels
    (criteria: module docstring). ``tokens``: the model's integer data inputs at the same step."""
    y = np.asarray(labels)
    if y.dtype.kind not in "iu" and not (y.dtype.kind == "f" and y.size and _integral(y)):
        return False
    ids = [np.asarray(value) for value in tokens]
    ids = [value for value in ids if value.dtype.kind in "iu" and value.ndim == 2 and value.size]
    classes = class_count(labels, predictions)
    for value in ids:
        if _shifted(y, value):
            return True
        rows, columns = value.shape
        one_per_token = y.size in (value.size, rows * (columns - 1), (rows - 1) * columns)
        if one_per_token and y.size > rows and classes is not None and classes > int(value.max()):
            return True
    if ids:
        return False
    p = np.asarray(predictions)
    return y.ndim == 2 and p.ndim == 3 and p.shape[0] == y.shape[0] and p.shape[2] == y.shape[1] and (
        p.shape[1] >= VOCABULARY_MIN_CLASSES
    )


def _shifted(labels: np.ndarray, tokens: np.ndarray) -> bool:
    """Whether ``labels`` are ``tokens`` (B x T or T x B) shifted by one position along either axis,
    wherever a label is not ignored (< 0): next-token targets."""
    rows, columns = tokens.shape
    candidates = []
    if labels.size == tokens.size:
        shaped = labels.reshape(rows, columns)
        candidates += [(shaped[:, :-1], tokens[:, 1:]), (shaped[:-1], tokens[1:])]
    if columns > 1 and labels.size == rows * (columns - 1):
        candidates.append((labels.reshape(rows, columns - 1), tokens[:, 1:]))
    if rows > 1 and labels.size == (rows - 1) * columns:
        candidates.append((labels.reshape(rows - 1, columns), tokens[1:]))
    for targets, following in candidates:
        kept = targets >= 0
        if kept.sum() >= 2 and np.array_equal(targets[kept], following[kept]):
            return True
    return False


def token_inputs(trial: Any, step: int) -> list[np.ndarray]:
    """The model's integer data inputs saved at ``step`` (token ids), for :func:`vocabulary_targets`."""
    values = read_values(trial, data_inputs(trial, step), step).values()
    return [array for array in map(np.asarray, values) if array.dtype.kind in "iu"]


def per_token_reason(rule: str) -> str:
    """Why a rule that judges class labels did not evaluate a run whose targets are all per-token."""
    return (
        "per-token targets over a vocabulary (a language model's next tokens): their frequencies are a "
        f"vocabulary's, not classes; {rule} judges class labels"
    )
