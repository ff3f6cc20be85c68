"""Keras layers' own ``activation=``: the pre-activation is captured for SaturatedActivation.

In-process, torch backend (conftest), real ``model.fit`` runs: the saved input of the tanh is
compared with ``x @ kernel + bias`` from the weights Keras used, and the rule fires on a
saturated tanh layer and stays silent on a healthy one.
"""

from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import trainguard.keras as tg  # noqa: E402
from tests.rules.synthetic import evaluate_rule  # noqa: E402
from trainguard.rules import RuleSpec  # noqa: E402
from trainguard.trial import create_trial  # noqa: E402

BATCH = 16
X = np.random.default_rng(0).normal(size=(128, 6)).astype("float32")
Y = (X[:, :1] > 0).astype("float32")


class WeightsAtBatchBegin(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.weights: list[list[np.ndarray]] = []

    def on_train_batch_begin(self, batch, logs=None):
        self.weights.append([np.array(keras.ops.convert_to_numpy(w)) for w in self.model.weights])


def _fit(out_dir, *, kernel_scale: float, epochs: int = 2) -> WeightsAtBatchBegin:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(
                16, activation="tanh", name="hidden",
                kernel_initializer=keras.initializers.RandomNormal(stddev=kernel_scale),
            ),
            keras.layers.Dense(1, activation="sigmoid", name="head"),
        ],
        name="net",
    )  # fmt: skip
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="binary_crossentropy")
    hook = tg.KerasHook(
        str(out_dir), save_config=tg.SaveConfig(save_interval=2),
        include_collections=["tanh_input", "sigmoid_input", "losses"],
    )  # fmt: skip
    recorder = WeightsAtBatchBegin()
    model.fit(X, Y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=[recorder, hook])
    hook.close()
    return recorder


def test_pre_activations_are_saved_with_their_values(tmp_path):
    recorder = _fit(tmp_path / "run", kernel_scale=0.3, epochs=1)
    trial = create_trial(str(tmp_path / "run"))
    assert set(trial.tensor_names(collection="tanh_input")) == {"hidden/tanh_input_0"}
    assert set(trial.tensor_names(collection="sigmoid_input")) == {"head/sigmoid_input_0"}
    assert trial.steps() == [0, 2, 4, 6]
    for step in trial.steps():
        kernel, bias = recorder.weights[step][0], recorder.weights[step][1]
        x = X[step * BATCH : (step + 1) * BATCH]
        np.testing.assert_allclose(trial.tensor("hidden/tanh_input_0").value(step), x @ kernel + bias, rtol=1e-5,
                                   atol=1e-6)  # fmt: skip


def test_saturated_activation_fires_on_a_saturated_keras_tanh_and_not_on_a_healthy_one(tmp_path):
    _fit(tmp_path / "saturated", kernel_scale=1000.0)  # |pre-activation| in the thousands: tanh is flat
    _fit(tmp_path / "healthy", kernel_scale=0.3)
    saturated = evaluate_rule(str(tmp_path / "saturated"), RuleSpec("SaturatedActivation"))
    healthy = evaluate_rule(str(tmp_path / "healthy"), RuleSpec("SaturatedActivation"))
    assert any(result.fired and "hidden/tanh_input_0" in result.message for result in saturated), [
        r.message for r in saturated
    ]
    assert healthy and not any(result.fired for result in healthy), [r.message for r in healthy if r.fired]
    assert not any(getattr(result, "not_evaluated", None) for result in healthy)
