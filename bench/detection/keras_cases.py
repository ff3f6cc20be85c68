"""Keras 3 cases (torch backend) captured by trainguard's ``KerasHook``.

Registered only where ``keras`` imports. Each run is a small classifier on separable synthetic
data trained with ``model.fit`` and the hook as a callback, as Keras users wire it in; the
per-batch losses for the label's symptom come from a ``LambdaCallback`` (Keras reports the
epoch's running mean, so its first and last values are what "learns" compares).

A tanh net initialised with stddev 20 or 100 was tried as a saturation fault and left out: its
loss still fell (1.92 -> 1.19; the output layer learns from the saturated +-1 features), so the
run does not show the fault's symptom.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np

from bench.detection.harness import METRICS_FILE
from bench.detection.registry import FAULTY, HEALTHY, Case

KERAS_COLLECTIONS = ["weights", "biases", "gradients", "losses", "inputs", "outputs", "relu_output", "tanh_input",
                     "sigmoid_input", "labels", "predictions"]  # fmt: skip


@dataclass(frozen=True)
class KerasSpec:
    arch: str = "dense"  # dense | conv | tanh
    lr: float = 0.05
    optimizer: str = "sgd"  # sgd | adam
    epochs: int = 4
    validation: bool = True
    seed: int = 0
    save_interval: int = 2


def _data(spec: KerasSpec) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(10 + spec.seed)
    if spec.arch == "conv":
        x = rng.normal(size=(512, 8, 8, 1)).astype("float32")
        y = (x[:, :4, :, 0].mean(axis=(1, 2)) > x[:, 4:, :, 0].mean(axis=(1, 2))).astype("int64")
    else:
        x = rng.normal(size=(512, 16)).astype("float32")
        y = (x[:, :4].sum(axis=1) > 0).astype("int64") + 2 * (x[:, 4:8].sum(axis=1) > 0).astype("int64")
    return x, y


def train_keras(out_dir: str, spec: KerasSpec) -> str:
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import keras

    import trainguard.keras as tg

    keras.utils.set_random_seed(spec.seed)
    x, y = _data(spec)
    classes = int(y.max()) + 1
    init = "glorot_uniform"
    if spec.arch == "conv":
        layers = [keras.Input((8, 8, 1)), keras.layers.Conv2D(8, 3, activation="relu", name="conv"),
                  keras.layers.Flatten(), keras.layers.Dense(classes, name="head")]  # fmt: skip
    elif spec.arch == "tanh":
        layers = [keras.Input((16,)), keras.layers.Dense(32, activation="tanh", kernel_initializer=init, name="hidden"),
                  keras.layers.Dense(32, activation="tanh", kernel_initializer=init, name="hidden2"),
                  keras.layers.Dense(classes, name="head")]  # fmt: skip
    else:
        layers = [keras.Input((16,)), keras.layers.Dense(32, activation="relu", name="hidden"),
                  keras.layers.Dense(32, activation="relu", name="hidden2"), keras.layers.Dense(classes, name="head")]
    model = keras.Sequential(layers)
    optimizer = keras.optimizers.Adam(spec.lr) if spec.optimizer == "adam" else keras.optimizers.SGD(spec.lr)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hook = tg.KerasHook(out_dir, save_config=tg.SaveConfig(save_interval=spec.save_interval),
                        include_collections=KERAS_COLLECTIONS)  # fmt: skip
    losses: list[float] = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: losses.append(float(logs["loss"])))
    validation = (x[:128], y[:128]) if spec.validation else None
    try:
        model.fit(x, y, batch_size=32, epochs=spec.epochs, validation_data=validation, callbacks=[hook, record],
                  verbose=0)  # fmt: skip
    finally:
        hook.close()
    metrics = {"spec": spec.__dict__, "losses": losses, "nonfinite": any(not math.isfinite(v) for v in losses)}
    with open(os.path.join(out_dir, METRICS_FILE), "w", encoding="utf-8") as file:
        json.dump(metrics, file)
    return out_dir


def keras_cases() -> list[Case]:
    import importlib.util

    if importlib.util.find_spec("keras") is None:
        return []
    K = KerasSpec

    def healthy(name: str, spec: KerasSpec, description: str) -> Case:
        return Case(f"healthy-keras-{name}", "keras", HEALTHY, train_keras, spec, (), 0, "learns", description)

    def faulty(name: str, spec: KerasSpec, expected: tuple[str, ...], symptom: str, description: str) -> Case:
        return Case(f"fault-keras-{name}", "keras", FAULTY, train_keras, spec, expected, 0, symptom, description)

    return [
        healthy("dense-val", K(), "Keras dense ReLU net, SGD, validation"),
        healthy("dense-noval-adam", K(optimizer="adam", lr=3e-3, validation=False, seed=1), "Adam, no validation"),
        healthy("conv", K(arch="conv", lr=0.05, seed=2), "Keras Conv2D on 8x8 images"),
        healthy("tanh", K(arch="tanh", lr=0.05, seed=3), "Keras tanh net (activation inputs captured)"),
        faulty("lr-high", K(lr=1e4, validation=False), ("ExplodingTensor", "WeightUpdateRatio", "LossNotDecreasing"),
               "diverges", "SGD at learning rate 1e4"),  # fmt: skip
        faulty("lr-zero", K(lr=0.0, validation=False), ("UnchangedTensor", "WeightUpdateRatio", "LossNotDecreasing"),
               "no_learning", "learning rate 0"),  # fmt: skip
    ]
