"""Synthetic but learnable tasks for the calibration corpus (numpy only, deterministic per seed).

Every task is a fixed function of a seed-independent "teacher" (the same problem for every seed)
plus noise, so a healthy model learns it within a few dozen steps on one CPU thread. Faults that
live in the data (unnormalised features, shuffled labels, padding, zero rows, ...) are switches
here; faults in the model or the loop live in :mod:`bench.detection.harness`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FEATURES = 20
IMAGE = (1, 12, 12)
VOCAB, LENGTH = 50, 16
SEQUENCE = (10, 8)  # time steps, features per step
MULTILABELS = 5


class Task:
    """Batches for one spec: ``train_batch()`` and ``eval_batch()`` give (inputs, targets)."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.rng = np.random.default_rng(1000 + spec.seed)
        teacher = np.random.default_rng(7)  # the same problem for every seed
        self.kind = spec.task
        classes = spec.classes
        if self.kind == "images":
            shape: tuple[int, ...] = IMAGE
        elif self.kind == "sequences":
            shape = SEQUENCE
        else:
            shape = (FEATURES,)
        self.prototypes = teacher.normal(scale=spec.separation, size=(classes, *shape))
        self.prototypes -= self.prototypes.mean(axis=0)
        self.regression_weights = teacher.normal(size=(FEATURES, 1)) / np.sqrt(FEATURES)
        self.multilabel_weights = teacher.normal(size=(FEATURES, MULTILABELS))
        preferences = teacher.random((classes, VOCAB - 1)) ** 3
        self.token_probabilities = preferences / preferences.sum(axis=1, keepdims=True)
        self.fixed: tuple[np.ndarray, np.ndarray] | None = None
        self.cursor = 0
        self.step = 0
        if spec.train_size:
            self.fixed = self._batch(spec.train_size, train=True)

    # -- one batch ------------------------------------------------------------------------------

    def _labels(self, size: int) -> np.ndarray:
        spec = self.spec
        if spec.data_fault == "imbalanced":
            return np.where(self.rng.random(size) < 0.95, 0, 1)
        return self.rng.integers(0, spec.classes, size=size)

    def _batch(self, size: int, train: bool) -> tuple[np.ndarray, np.ndarray]:
        spec = self.spec
        if self.kind == "xor":
            x = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], dtype=np.float32)
            y = np.array([0, 1, 1, 0], dtype=np.float32)
            index = self.rng.integers(0, 4, size=size) if size != 4 else np.arange(4)
            return x[index], y[index]
        if self.kind == "regression":
            x = self.rng.normal(size=(size, FEATURES)).astype(np.float32)
            y = (x @ self.regression_weights + 0.1 * self.rng.normal(size=(size, 1))).astype(np.float32)
            if spec.data_fault == "unscaled_targets":
                y = y * 1000.0 + 5000.0
            return self._input_faults(x, train), y
        if self.kind == "multilabel":
            x = self.rng.normal(size=(size, FEATURES)).astype(np.float32)
            y = (x @ self.multilabel_weights > 0.5).astype(np.float32)
            return self._input_faults(x, train), y
        labels = self._labels(size)
        if self.kind == "tokens":
            tokens = np.stack(
                [1 + self.rng.choice(VOCAB - 1, size=LENGTH, p=self.token_probabilities[label]) for label in labels]
            )
            if spec.data_fault == "padded_tokens":  # ~80 % of every sequence is padding 0
                lengths = self.rng.integers(2, 5, size=size)
                tokens[np.arange(LENGTH)[None, :] >= lengths[:, None]] = 0
            x: np.ndarray = tokens.astype(np.int64)
        else:
            noise = self.rng.normal(scale=spec.noise, size=(size, *self.prototypes.shape[1:]))
            x = self.prototypes[labels] + noise
            if spec.data_fault == "imbalanced":  # standardised as a fitted scaler would: the label-weighted mean
                x = x - (0.95 * self.prototypes[0] + 0.05 * self.prototypes[1])
            x = x.astype(np.float32)
            x = self._input_faults(x, train)
        if train and (
            spec.data_fault == "shuffled_labels" and self.step >= spec.onset
        ):  # labels unrelated to the inputs (a misaligned join, a shuffled label file)
            labels = self.rng.integers(0, spec.classes, size=size)
        if train and spec.label_noise:
            flip = self.rng.random(size) < spec.label_noise
            labels = np.where(flip, self.rng.integers(0, spec.classes, size=size), labels)
        return x, labels

    def _input_faults(self, x: np.ndarray, train: bool) -> np.ndarray:
        fault = self.spec.data_fault
        if fault == "offset_scaled":
            x = x * 100.0 + 50.0
        elif fault == "unit_images":  # ToTensor() only: values in [0, 1], mean ~0.5
            x = 1.0 / (1.0 + np.exp(-x))
        elif fault == "raw_images":  # uint8 pixel values as floats
            x = 255.0 / (1.0 + np.exp(-x))
        elif fault == "zero_inputs" and self.step >= self.spec.onset:  # a broken normalisation: all zeros
            x = np.zeros_like(x)
        elif fault == "nan_inputs" and train and self.step >= self.spec.onset:  # a missing value slips in
            x = x.copy()
            x[0, 0] = np.nan
        if self.spec.zero_rows:  # sparse inputs: many rows all zero (batch size 1 runs see whole zero batches)
            rows = self.rng.random(len(x)) < self.spec.zero_rows
            x = x.copy()
            x[rows] = 0.0
        return x.astype(np.float32)

    def train_batch(self) -> tuple[np.ndarray, np.ndarray]:
        if self.fixed is None:
            return self._batch(self.spec.batch, train=True)
        x, y = self.fixed
        index = (np.arange(self.spec.batch) + self.cursor) % len(y)
        self.cursor = (self.cursor + self.spec.batch) % len(y)
        return x[index], y[index]

    def eval_batch(self) -> tuple[np.ndarray, np.ndarray]:
        return self._batch(max(self.spec.batch, 16), train=False)
