"""Zero code change for Keras 3 (issue 43 item 9): ``trainguard run`` on a script that never
mentions trainguard captures its fit through the Keras hook, on the torch and JAX backends;
PyTorch's zero-code hook keeps off Keras's torch modules; the TensorFlow backend is refused
in one line (faked here: TensorFlow is not installed)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("keras")

import keras  # noqa: E402

from trainguard.config import CaptureConfig  # noqa: E402
from trainguard.hooks import keras as keras_hook_module  # noqa: E402
from trainguard.hooks.keras_zero_code import KerasZeroCode  # noqa: E402
from trainguard.modes import ModeKeys  # noqa: E402
from trainguard.trials import create_trial  # noqa: E402

JOB = Path(__file__).with_name("_keras_plain_job.py")


def _trainguard_run(tmp_path: Path, backend: str, *job_args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / f"run-{backend}-{'-'.join(job_args) or 'plain'}"
    environment = {**os.environ, "KERAS_BACKEND": backend}
    command = [sys.executable, "-m", "trainguard.cli", "run", "--rules", "--save-interval", "2", "--out", str(out),
               "--", sys.executable, str(JOB), *job_args]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment, cwd=tmp_path)
    return done, out


def _assert_captured(done: subprocess.CompletedProcess[str], out: Path, backend: str) -> None:
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"trained {backend}" in done.stdout
    assert "Cannot copy out of meta tensor" not in done.stderr
    assert "capture disabled" not in done.stderr, done.stderr
    trial = create_trial(str(out))
    assert trial.steps(ModeKeys.TRAIN) and trial.steps(ModeKeys.EVAL)
    assert "loss" in trial.tensor_names(collection="losses")
    assert {"hidden/kernel", "squash/kernel", "head/kernel"} <= set(trial.tensor_names(collection="weights"))
    assert "gradients/hidden/kernel" in trial.tensor_names(collection="gradients")
    # what the default rules read, through the Keras names
    assert trial.tensor_names(collection="tanh_input") == ["squash/tanh_input_0"]
    assert trial.tensor_names(collection="relu_input") == ["hidden/relu_input_0"]
    # only the Keras hook wrote: no tensor named the way PyTorch's zero-code hook names modules
    assert not [name for name in trial.tensor_names() if "Sequential_" in name or name.endswith(".weight")]


@pytest.mark.parametrize("job_args", [(), ("torch-first",)], ids=["keras-imports-torch", "torch-imported-first"])
def test_an_unmodified_keras_script_is_captured_on_the_torch_backend(tmp_path: Path, job_args: tuple[str, ...]) -> None:
    done, out = _trainguard_run(tmp_path, "torch", *job_args)
    _assert_captured(done, out, "torch")



def test_an_smdebug_keras_script_under_trainguard_run_captures_through_its_own_hook(tmp_path: Path) -> None:
    # KerasHook.create_from_json_file() without a debughookconfig.json takes the run's capture
    # config (its --out, --save-interval 2, the rules' collections); zero-code adds no second hook
    done, out = _trainguard_run(tmp_path, "torch", "smdebug-hook")
    _assert_captured(done, out, "torch")
    assert create_trial(str(out)).steps(ModeKeys.TRAIN)[:3] == [0, 2, 4]

def test_an_unmodified_keras_script_is_captured_on_the_jax_backend(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    done, out = _trainguard_run(tmp_path, "jax")
    _assert_captured(done, out, "jax")


def test_the_tensorflow_backend_is_refused_in_one_line(tmp_path: Path, monkeypatch, caplog) -> None:
    original_fit = keras.Model.fit
    zero_code = KerasZeroCode(lambda: CaptureConfig(out_dir=str(tmp_path / "zero")), backend="tensorflow")
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        assert zero_code.arm() is False
    assert keras.Model.fit is original_fit
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1 and "tensorflow backend is not captured" in lines[0] and "KERAS_BACKEND=torch" in lines[0]
    caplog.clear()
    monkeypatch.setattr(keras_hook_module, "BACKEND", "tensorflow")
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        hook = keras_hook_module.KerasHook(out_dir=str(tmp_path / "hook"))
    assert not hook.enabled
    assert any("tensorflow backend is not captured" in record.getMessage() for record in caplog.records)
    hook.close()
    assert not (tmp_path / "hook").exists() or not any((tmp_path / "hook").rglob("*.tfevents"))


def test_zero_code_adds_one_hook_and_leaves_a_script_s_own_hook_alone(tmp_path: Path) -> None:
    made: list[dict] = []

    def config() -> CaptureConfig:
        made.append({})
        return CaptureConfig(out_dir=str(tmp_path / "zero"))

    zero_code = KerasZeroCode(config, backend=keras.backend.backend())
    assert zero_code.arm()
    try:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
        x, y = keras.ops.ones((8, 3)), keras.ops.zeros((8, 2))
        own = keras_hook_module.KerasHook(out_dir=str(tmp_path / "own"))
        model.fit(x, y, epochs=1, batch_size=4, verbose=0, callbacks=[own])
        assert zero_code.hook is None and not made  # the script's own hook captures
        model.fit(x, y, epochs=1, batch_size=4, verbose=0)
        model.evaluate(x, y, batch_size=4, verbose=0)
        assert zero_code.hook is not None and len(made) == 1
        own.close()
        zero_code.hook.close()
        assert create_trial(str(tmp_path / "zero")).steps(ModeKeys.TRAIN)
    finally:
        zero_code.disarm()


def test_a_script_that_never_calls_fit_is_told_at_exit(tmp_path: Path, caplog) -> None:
    zero_code = KerasZeroCode(lambda: CaptureConfig(out_dir=str(tmp_path / "zero")), backend=keras.backend.backend())
    assert zero_code.arm()
    try:
        with caplog.at_level(logging.WARNING, logger="trainguard"):
            zero_code.report_unused()
        assert any("no Model.fit/evaluate/predict ran" in record.getMessage() for record in caplog.records)
    finally:
        zero_code.disarm()
