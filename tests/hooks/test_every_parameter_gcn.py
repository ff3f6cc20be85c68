"""A graph convolution whose parameters are bare ``nn.Parameter``s named ``kernel``/``offset``,
through the real CLI (``trainguard run --rules --stop-on-issue``, budget on, issue 43): its
weights and gradients are saved, WeightUpdateRatio and LossNotDecreasing judge it (its ~1 ms
full-batch steps make the budget thin its saves, the floor keeps the losses the loss rule needs),
the healthy run has no finding, its learning-rate x 1e4 and learning-rate 0 twins are found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.modes import ModeKeys
from trainguard.rules.builtin.loss_not_decreasing import LossNotDecreasing
from trainguard.trials import create_trial

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "hooks" / "every_parameter_scripts" / "gcn.py"
KERNELS = {"GCN_layer1.kernel", "GCN_layer2.kernel"}


def _run(out: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "trainguard.cli", "run", "--out", str(out), "--rules", "--stop-on-issue", "--",
               sys.executable, str(SCRIPT), *args]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=600)


def _outputs(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (out / "rule-output").glob("*.json")}


def _findings(out: Path) -> dict[str, list[dict]]:
    """Each rule's findings that are not advice."""
    return {name: [f for f in doc["findings"] if not f.get("advice")] for name, doc in _outputs(out).items()}


@pytest.mark.slow
def test_a_gcn_with_bare_kernels_is_watched_and_its_healthy_run_silent(tmp_path):
    result = _run(tmp_path / "run")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    trial = create_trial(str(tmp_path / "run"))
    weights = set(trial.tensor_names(collection="weights"))
    assert KERNELS <= weights
    assert {f"gradient/{name}" for name in KERNELS} <= set(trial.tensor_names(collection="gradients"))
    losses = trial.tensor(trial.tensor_names(collection="losses")[0]).steps(ModeKeys.TRAIN)
    assert len(losses) >= 2 * LossNotDecreasing.window.default, losses
    outputs = _outputs(tmp_path / "run")
    for rule in ("WeightUpdateRatio", "LossNotDecreasing"):
        assert outputs[rule]["status"] == "NoIssuesFound", outputs[rule]["status_details"]
    findings = _findings(tmp_path / "run")
    assert not any(findings.values()), {name: f[:1] for name, f in findings.items() if f}


@pytest.mark.slow
@pytest.mark.parametrize(("lr", "rules"), [("100", {"WeightUpdateRatio", "ExplodingTensor", "LossNotDecreasing"}),
                                           ("0", {"WeightUpdateRatio", "UnchangedTensor", "LossNotDecreasing"})])  # fmt: skip
def test_its_learning_rate_x_1e4_and_0_twins_are_found(tmp_path, lr, rules):
    result = _run(tmp_path / "run", "--lr", lr)
    findings = _findings(tmp_path / "run")
    found = {name for name, items in findings.items() if items}
    assert found & rules, (found, result.stdout[-3000:])
    if lr == "0":
        first = findings["WeightUpdateRatio"][0]
        assert first["details"]["direction"] == "small" and first["details"]["tensor"] in KERNELS | {
            "GCN_layer1.offset", "GCN_layer2.offset"}  # fmt: skip
