"""The Keras hook under real ``model.fit``/``evaluate``/``predict``, torch and JAX backends.

The job (``_keras_job.py``) runs in a subprocess and records what Keras reports; the test reads
the hook's output back with trainguard's trial and compares: names, steps, modes, weights with
the model's own, gradients with a numpy reference, losses with Keras's logs.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainguard.modes import ModeKeys
from trainguard.trial import create_trial

pytest.importorskip("keras", reason="the Keras tests need keras>=3.5: pip install 'trainguard[keras]'")

JOB = Path(__file__).with_name("_keras_job.py")
REPO = Path(__file__).resolve().parents[2]
BATCH, EPOCH_BATCHES = 4, 4

BACKENDS = [
    "torch",
    pytest.param(
        "jax", marks=pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
    ),
]


def run_job(backend: str, scenario: str, tmp: Path) -> tuple[Path, dict[str, np.ndarray]]:
    out, record = tmp / "run", tmp / "record.npz"
    env = {
        **os.environ,
        "KERAS_BACKEND": backend,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    env.setdefault("JAX_PLATFORMS", "cpu")
    result = subprocess.run(
        [sys.executable, str(JOB), scenario, str(out), str(record)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    with np.load(record) as data:
        return out, {key: data[key] for key in data.files} | {"stderr": np.array(result.stderr)}


@pytest.fixture(scope="module", params=BACKENDS)
def full_run(request, tmp_path_factory):
    out, record = run_job(request.param, "full", tmp_path_factory.mktemp(f"keras-{request.param}"))
    return create_trial(out), record, out


def batch(record: dict[str, np.ndarray], mode_step: int) -> tuple[np.ndarray, np.ndarray]:
    """The TRAIN batch of a mode step (the job trains unshuffled)."""
    index = mode_step % EPOCH_BATCHES
    return record["x"][index * BATCH : (index + 1) * BATCH], record["y"][index * BATCH : (index + 1) * BATCH]


def reference(w1, b1, w2, b2, x, y):
    """Forward and MSE gradients of Dense(relu) -> Dense, in float64 numpy."""
    w1, b1, w2, b2, x, y = (np.asarray(a, dtype=np.float64) for a in (w1, b1, w2, b2, x, y))
    z = x @ w1 + b1
    hidden = np.maximum(z, 0)
    out = hidden @ w2 + b2
    d_out = 2 * (out - y) / out.size
    d_hidden = (d_out @ w2.T) * (z > 0)
    gradients = {
        "hidden/kernel": x.T @ d_hidden,
        "hidden/bias": d_hidden.sum(0),
        "head/kernel": hidden.T @ d_out,
        "head/bias": d_out.sum(0),
    }
    return hidden, out, gradients


# Global steps of the job: fit 2 epochs x (4 TRAIN + 2 EVAL batches), evaluate 2, predict 2;
# saving every 2nd step of each mode.
SAVED = {0: (ModeKeys.TRAIN, 0), 2: (ModeKeys.TRAIN, 2), 4: (ModeKeys.EVAL, 0), 6: (ModeKeys.TRAIN, 4),
         8: (ModeKeys.TRAIN, 6), 10: (ModeKeys.EVAL, 2), 12: (ModeKeys.EVAL, 4), 14: (ModeKeys.PREDICT, 0)}  # fmt: skip
TRAIN_STEPS = [step for step, (mode, _) in SAVED.items() if mode == ModeKeys.TRAIN]
# Validation passes are judged whole (hooks/eval_passes.py): the losses of every EVAL step of a
# pass are saved too, so the unsaved EVAL steps 5, 11 and 13 hold the losses and nothing else.
EVAL_PASS_LOSS_STEPS = {5: (ModeKeys.EVAL, 1), 11: (ModeKeys.EVAL, 3), 13: (ModeKeys.EVAL, 5)}
WEIGHTS = ["hidden/kernel", "hidden/bias", "head/kernel", "head/bias"]


def test_steps_modes_and_end_marker(full_run):
    trial, record, out = full_run
    assert record["leftovers"] == 0
    assert trial.steps() == sorted({**SAVED, **EVAL_PASS_LOSS_STEPS})
    for step, (mode, mode_step) in {**SAVED, **EVAL_PASS_LOSS_STEPS}.items():
        assert (trial.mode(step), trial.mode_step(step)) == (mode, mode_step)
    assert trial.steps(mode=ModeKeys.EVAL) == [0, 1, 2, 3, 4, 5]
    losses = set(trial.tensor_names(collection="losses"))
    for step in EVAL_PASS_LOSS_STEPS:
        saved = {name for name in trial.tensor_names() if step in trial.tensor(name).steps()}
        assert saved and saved <= losses, (step, saved - losses)
    assert (out / "training_job_end.ts").exists()


def test_names_and_collections(full_run):
    trial, _, _ = full_run
    assert set(trial.tensor_names(collection="weights")) == {"hidden/kernel", "head/kernel"}
    assert set(trial.tensor_names(collection="biases")) == {"hidden/bias", "head/bias"}
    assert set(trial.tensor_names(collection="gradients")) == {f"gradients/{name}" for name in WEIGHTS}
    assert set(trial.tensor_names(collection="losses")) == {"loss"}
    assert set(trial.tensor_names(collection="metrics")) == {"mae"}
    assert set(trial.tensor_names(collection="outputs")) == {"hidden_output_0", "head_output_0", "net_output_0"}
    assert "hidden_output_0" in trial.collection("relu_output").tensor_names


def test_weights_are_the_models_weights_at_each_step(full_run):
    trial, record, _ = full_run
    names = [str(path).split("/", 1)[1] for path in record["weight_names"]]
    assert names == WEIGHTS
    for step in TRAIN_STEPS:
        mode_step = trial.mode_step(step)
        for index, name in enumerate(names):
            np.testing.assert_array_equal(trial.tensor(name).value(step), record[f"weights_{index}"][mode_step])
    # no training between TRAIN step 4 and the validation before it: same weights
    np.testing.assert_array_equal(trial.tensor("head/kernel").value(4), record["weights_2"][4])


def test_gradients_match_a_numpy_reference(full_run):
    trial, record, _ = full_run
    for step in TRAIN_STEPS:
        mode_step = trial.mode_step(step)
        weights = [record[f"weights_{i}"][mode_step] for i in range(4)]
        x, y = batch(record, mode_step)
        hidden, out, gradients = reference(*weights, x, y)
        for name, expected in gradients.items():
            saved = trial.tensor(f"gradients/{name}").value(step)
            assert np.abs(saved).sum() > 0
            np.testing.assert_allclose(saved, expected, rtol=1e-4, atol=1e-6)
            l2 = trial.tensor(f"gradients/{name}").reduction_value(step, "l2")
            np.testing.assert_allclose(l2, np.linalg.norm(saved.ravel()), rtol=1e-6)
        np.testing.assert_allclose(trial.tensor("hidden_output_0").value(step), hidden, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(trial.tensor("head_output_0").value(step), out, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(
            trial.tensor("net_output_0").value(step), trial.tensor("head_output_0").value(step)
        )
    assert trial.tensor("gradients/head/kernel").steps() == TRAIN_STEPS  # never in EVAL/PREDICT


def test_losses_and_metrics_are_kerass_logs(full_run):
    trial, record, _ = full_run
    for step, (mode, _) in SAVED.items():
        assert record["modes"][step] == mode.name
        if mode == ModeKeys.PREDICT:
            continue
        assert trial.tensor("loss").value(step) == record["losses"][step]
        assert trial.tensor("mae").value(step) == record["maes"][step]
    assert ModeKeys.PREDICT.value not in {trial.mode(step).value for step in trial.tensor("loss").steps()}


def test_save_scalar_goes_with_the_next_saved_step(full_run):
    trial, _, _ = full_run
    epoch = trial.tensor("scalar/epoch")  # saved at each epoch begin: TRAIN steps 0 and 4
    assert epoch.steps() == [0, 6]
    assert [float(epoch.value(step)[0]) for step in (0, 6)] == [0.0, 1.0]
    assert "scalar/epoch" in trial.tensor_names(collection="scalars")


def test_predict_outputs_are_the_predictions(full_run):
    trial, record, _ = full_run
    np.testing.assert_allclose(trial.tensor("net_output_0").value(14), record["predictions"][:8], rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fail_open_training_is_unchanged(backend, tmp_path):
    _, record = run_job(backend, "failopen", tmp_path)
    assert not record["late_enabled"]
    if backend == "jax":
        assert not record["variant_enabled"]  # the capture step failed; Keras's own step ran
    for label in ("late", "variant"):
        np.testing.assert_array_equal(record[f"{label}_loss"], record["plain_loss"])
        for index in range(4):
            np.testing.assert_array_equal(record[f"{label}_weight_{index}"], record[f"plain_weight_{index}"])
    assert str(record["stderr"]).count("trainguard: capture disabled") == (2 if backend == "jax" else 1)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_subclassed_model_with_nested_layers(backend, tmp_path):
    out, record = run_job(backend, "subclassed", tmp_path)
    for label in ("default", "eager") if backend == "jax" else ("default",):
        assert record[f"{label}_enabled"]
        trial = create_trial(out / label)
        assert trial.steps() == [0, 2]
        names = [str(path).split("/", 1)[1] for path in record[f"{label}_paths"]]
        saved = set(trial.tensor_names(collection="weights")) | set(trial.tensor_names(collection="biases"))
        assert saved == set(names)
        for step in (0, 2):
            for index, name in enumerate(names):
                np.testing.assert_array_equal(trial.tensor(name).value(step), record[f"{label}_weights_{index}"][step])
        gradients = {f"gradients/{name}" for name in names if "moving" not in name}
        assert set(trial.tensor_names(collection="gradients")) == gradients
        for name in gradients:
            value = trial.tensor(name).value(2)
            assert np.isfinite(value).all() and np.abs(value).sum() > 0
        outputs = set(trial.tensor_names(collection="outputs"))
        assert outputs == {f"{layer}_output_0" for layer in ("net", "block", "conv", "bn", "drop", "flat", "head")}
        assert "conv_output_0" in trial.collection("relu_output").tensor_names
        assert trial.tensor("conv_output_0").value(0).shape == (4, 6, 6, 4)
