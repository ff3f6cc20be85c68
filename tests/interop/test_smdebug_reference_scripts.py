"""The smdebug side of the interop harness works, and shows the smdebug facts we rely on.

These tests exercise only smdebug 1.0.34 (in its venv) and the driver scripts; they pin down the
reference data that trainguard's reader and writer tests compare against.
"""

import subprocess

import numpy as np
import pytest
from smdebug_env import run_smdebug_script

pytestmark = pytest.mark.interop


def test_hook_run_layout(smdebug_hook_run):
    run_dir, expected = smdebug_hook_run
    smd = expected["smdebug"]
    assert (run_dir / "training_job_end.ts").exists()
    assert expected["layout"] == {"TRAIN": [0, 1, 2, 3, 6, 7], "EVAL": [4, 5]}
    assert smd["steps"]["GLOBAL"] == list(range(8))
    assert smd["steps"]["TRAIN"] == [0, 1, 2, 3, 4, 5]  # mode steps continue after EVAL
    assert smd["steps"]["EVAL"] == [0, 1]
    assert smd["workers"] == ["worker_0"]
    assert {
        "Net_fc1.weight",
        "gradient/Net_fc1.weight",
        "CrossEntropyLoss_output_0",
        "scalar/lr",
        "custom_counts",
    } <= set(smd["tensor_names"])
    # Gradients are never saved in EVAL.
    assert smd["tensors"]["gradient/Net_fc1.weight"]["steps"]["GLOBAL"] == [0, 1, 2, 3, 6, 7]


def test_hook_run_values_match_training_loop(smdebug_hook_run):
    _, expected = smdebug_hook_run
    tensors, training = expected["smdebug"]["tensors"], expected["training"]
    loss = tensors["CrossEntropyLoss_output_0"]["values"]
    for mode, steps in expected["layout"].items():
        for mode_step, global_step in enumerate(steps):
            assert loss[str(global_step)]["shape"] == []  # a 0-d torch loss keeps shape ()
            assert loss[str(global_step)]["value"] == pytest.approx(training["losses"][mode][str(mode_step)])
            # Weights are saved at the start of the step: the values before the update.
            np.testing.assert_array_equal(
                np.float32(tensors["Net_fc1.weight"]["values"][str(global_step)]["value"]),
                np.float32(training["params_before_step"][str(global_step)]["fc1.weight"]),
            )


def test_hook_run_reductions(smdebug_hook_run):
    _, expected = smdebug_hook_run
    tensors = expected["smdebug"]["tensors"]
    # biases: reductions only -> value() fails, reduction_value() answers.
    bias = tensors["Net_fc1.bias"]
    assert "TensorUnavailableForStep" in bias["values"]["0"]["error"]
    assert set(bias["reductions"]["0"]) == {"min", "max", "mean", "std", "l2"}
    # gradients: raw tensor and reductions both present.
    grad = tensors["gradient/Net_fc1.bias"]
    assert grad["values"]["0"]["shape"] == [16]
    assert set(grad["reductions"]["0"]) == {"max", "mean", "abs_mean", "l2"}
    assert grad["reductions"]["0"]["max"] == pytest.approx(max(grad["values"]["0"]["value"]))


def test_read_script_agrees_with_writer_dump(smdebug_hook_run, read_with_smdebug):
    run_dir, expected = smdebug_hook_run
    assert read_with_smdebug(run_dir) == expected["smdebug"]


def test_raw_run_documents_smdebug_read_bugs(smdebug_raw_run):
    _, expected = smdebug_raw_run
    truth, smd = expected["tensors"], expected["smdebug_read"]["tensors"]
    assert smd["float32"]["values"]["1"]["value"] == truth["float32"]["steps"]["1"]["value"]
    assert smd["scalar_0d"]["values"]["1"]["shape"] == truth["scalar_0d"]["steps"]["1"]["shape"] == []
    # smdebug decodes DT_INT8 as uint8 ...
    assert smd["int8"]["values"]["0"]["dtype"] == "uint8"
    assert truth["int8"]["steps"]["0"]["value"] == [-128, -1, 0, 1, 127]
    # ... and cannot decode these at all.
    for name in ("int16", "uint16", "uint32", "uint64", "complex64"):
        assert "KeyError" in smd[name]["values"]["0"]["error"], name
    assert "error" in smd["empty_float32"]["values"]["0"]
    assert smd["empty_int64"]["values"]["0"]["value"] is None
    assert expected["smdebug_read"]["steps"]["PREDICT"] == [0]
    assert smd["train_only"]["steps"]["GLOBAL"] == [0, 1, 10]


def test_read_script_refuses_unfinished_run(smdebug_python, tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(subprocess.CalledProcessError) as err:
        run_smdebug_script("read_with_smdebug.py", tmp_path / "run", tmp_path / "out.json")
    assert "training_job_end.ts" in err.value.stderr
