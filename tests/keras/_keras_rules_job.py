"""A Keras run for the rule tests:
``KERAS_BACKEND=torch python _keras_rules_job.py healthy|exploding|unnormalized OUT``.

A small classifier on separable synthetic data; ``exploding`` trains it with SGD at a learning
rate of 1e6, so that weights and losses overflow within a few batches, as in the PyTorch fault
suite.
"""

from __future__ import annotations

import sys

import keras
import numpy as np

import trainguard.keras as tg


def main(scenario: str, out_dir: str) -> None:
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int64")
    if scenario == "unnormalized":  # features around 50 with a spread of 20: NotNormalizedData's case
        x = x * 20.0 + 50.0
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu", name="hidden"),
            keras.layers.Dense(2, name="head"),
        ]
    )
    lr = {"exploding": 1e6, "unnormalized": 1e-4}.get(scenario, 0.05)
    model.compile(optimizer=keras.optimizers.SGD(lr), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hook = tg.KerasHook(
        out_dir,
        save_config=tg.SaveConfig(save_interval=2),
        include_collections=["weights", "biases", "gradients", "losses", "outputs", "relu_output", "model_inputs"],
    )
    model.fit(x, y, batch_size=32, epochs=3, validation_data=(x[:128], y[:128]), callbacks=[hook], verbose=0)
    hook.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
