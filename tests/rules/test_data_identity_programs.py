"""Healthy programs of kinds written elsewhere, under the default rules (``trainguard run --rules
--stop-on-issue``), whose data rules once judged tensors that are not data, or standard
preprocessing as a fault (issue 43 item 2); and their broken twins, still reported.

Healthy: no IssuesFound, nothing stopped (advice allowed); the data rule that was wrong says
nothing at all. Programs in ``data_identity_scripts/``:

* word-level language models (LSTM, GRU, tanh RNN) whose detached hidden state is fed back, and
  a Transformer one: the state is not data, next-token targets are not classes;
* a forward-forward network whose layers call their own ``forward()``;
* a 2-layer GCN on row-normalised sparse bag-of-words features with a normalised sparse adjacency;
* polynomial regression on x..x⁴ (x⁴ is advice at most: it cannot be told from an unscaled raw
  feature on the same scale, see NotNormalizedData's docstring);
* a CNN on crops zero-padded before Normalize, and on [0, 1] images (advice at most).

Twins: raw 0..255 pixels, a feature in units of 1e4, every label one class.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "rules" / "data_identity_scripts"


def _run(out: Path, script: str, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, dict]]:
    command = [sys.executable, "-m", "trainguard.cli", "run", "--out", str(out), "--rules", "--stop-on-issue", "--",
               sys.executable, str(SCRIPTS / script), *args]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=900)
    outputs = {path.stem: json.loads(path.read_text()) for path in (out / "rule-output").glob("*.json")}
    return result, outputs


def _issues(outputs: dict[str, dict]) -> dict[str, list]:
    return {name: [f for f in doc["findings"] if not f.get("advice")] for name, doc in outputs.items()}


def _assert_healthy(result: subprocess.CompletedProcess, out: Path, outputs: dict[str, dict], *quiet: str) -> None:
    """No issue (advice allowed), nothing stopped; the rules in ``quiet`` report nothing, not even advice."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not (out / "trainguard-stop.json").exists()
    assert outputs and not any(_issues(outputs).values()), _issues(outputs)
    assert "0 found issues" in result.stdout
    for rule in quiet:
        assert not outputs[rule]["findings"], (rule, outputs[rule]["findings"][:1])


def _members(out: Path, collection: str) -> list[str]:
    from trainguard.trial import create_trial

    known = create_trial(str(out)).collections()
    return sorted(known[collection].tensor_names) if collection in known else []


@pytest.mark.slow
@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN_TANH"])
def test_word_language_model_with_its_state_fed_back(tmp_path: Path, cell: str) -> None:
    out = tmp_path / "run"
    result, outputs = _run(out, "word_lm.py", "--cell", cell, "--steps", "400")
    _assert_healthy(result, out, outputs, "NotNormalizedData", "ClassImbalance")
    inputs = ["RNNModel_input_1", "RNNModel_input_2"] if cell == "LSTM" else ["RNNModel_input_1"]
    assert _members(out, "derived_inputs") == inputs  # the state, found fed back
    assert "RNNModel_input_0" in _members(out, "model_inputs")  # the tokens are data
    assert "per-token targets over a vocabulary" in outputs["ClassImbalance"]["status_details"]


@pytest.mark.slow
def test_transformer_language_model_next_tokens_are_not_classes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result, outputs = _run(out, "word_lm.py", "--cell", "TRANSFORMER", "--lr", "0.5", "--steps", "400")
    _assert_healthy(result, out, outputs, "ClassImbalance")
    assert "per-token targets over a vocabulary" in outputs["ClassImbalance"]["status_details"]


@pytest.mark.slow
def test_forward_forward_network_calling_forward_directly(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result, outputs = _run(out, "forward_forward.py")
    _assert_healthy(result, out, outputs, "NotNormalizedData")
    assert "ReLU_input_0" in _members(out, "derived_inputs")  # the pre-activation of a direct forward()


@pytest.mark.slow
def test_graph_convolution_on_row_normalised_features(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result, outputs = _run(out, "gcn.py")
    _assert_healthy(result, out, outputs, "NotNormalizedData")
    assert outputs["NotNormalizedData"]["status"] == "NoIssuesFound"  # judged, not merely skipped


@pytest.mark.slow
def test_polynomial_regression_is_healthy_and_its_unscaled_twin_is_reported(tmp_path: Path) -> None:
    result, outputs = _run(tmp_path / "healthy", "poly_regression.py")
    _assert_healthy(result, tmp_path / "healthy", outputs)
    _, faulty = _run(tmp_path / "unscaled", "poly_regression.py", "--fault", "unscaled")
    found = faulty["NotNormalizedData"]["findings"]
    assert found and found[0]["details"]["channel"] == 4, found[:1]


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["padded", "unit"])
def test_cnn_on_standard_image_pipelines(tmp_path: Path, pipeline: str) -> None:
    out = tmp_path / "run"
    result, outputs = _run(out, "image_cnn.py", "--pipeline", pipeline)
    # padded crops are normalised: nothing to say; [0, 1] images may get advice, never an issue
    _assert_healthy(result, out, outputs, *(["CheckInputImages", "NotNormalizedData"] if pipeline == "padded" else []))
    assert outputs["CheckInputImages"]["status"] == "NoIssuesFound"


@pytest.mark.slow
def test_cnn_on_raw_pixels_is_reported(tmp_path: Path) -> None:
    _, outputs = _run(tmp_path / "run", "image_cnn.py", "--pipeline", "raw")
    for rule in ("CheckInputImages", "NotNormalizedData"):
        found = outputs[rule]["findings"]
        assert found and max(abs(m) for m in found[0]["details"]["means"]) > 50, (rule, found[:1])


@pytest.mark.slow
def test_all_labels_one_class_is_reported(tmp_path: Path) -> None:
    _, outputs = _run(tmp_path / "run", "image_cnn.py", "--labels", "one_class")
    found = outputs["ClassImbalance"]["findings"]
    assert found and "every one of the" in found[0]["message"] and "class 0" in found[0]["message"], found[:1]
