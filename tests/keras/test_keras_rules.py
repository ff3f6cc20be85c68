"""The built-in rules run unchanged on a Keras hook's output (torch backend, real training)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("keras")

from trainguard.modes import ModeKeys  # noqa: E402
from trainguard.rules import RuleSpec  # noqa: E402
from trainguard.rules.runner import RuleRunner  # noqa: E402
from trainguard.trial import create_trial  # noqa: E402

JOB = Path(__file__).with_name("_keras_rules_job.py")
RULES = ["ExplodingTensor", "VanishingGradient", "LossNotDecreasing", "DeadRelu", "WeightUpdateRatio", "Overfit"]


def _run(tmp_path: Path, scenario: str, rules: list[str] = RULES) -> dict:
    out = tmp_path / scenario
    environment = {**os.environ, "KERAS_BACKEND": "torch", "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, str(JOB), scenario, str(out)], check=True, env=environment, timeout=300)
    final = RuleRunner(
        str(out), [RuleSpec(name) for name in rules], output_dir=str(tmp_path / f"{scenario}-rules"), poll_interval=0.05
    ).run()
    return {name: update for name, update in final.items()}


def test_rules_find_the_exploding_keras_run_and_stay_silent_on_the_healthy_one(tmp_path):
    healthy = _run(tmp_path, "healthy")
    assert {name: u.status.value for name, u in healthy.items()} == {name: "NoIssuesFound" for name in RULES}
    # each rule really looked at the Keras tensors: it evaluated steps and found what it needs
    for name, update in healthy.items():
        assert update.last_evaluated_step is not None, name
        assert "Missing data" not in update.status_details, (name, update.status_details)
    trial = create_trial(str(tmp_path / "healthy"))
    assert trial.tensor_names(collection="gradients") and trial.tensor_names(collection="relu_output")
    assert trial.steps(ModeKeys.TRAIN) and trial.steps(ModeKeys.EVAL)  # Overfit had both modes' losses
    exploding = _run(tmp_path, "exploding")
    # the rules read Keras's weights (WeightUpdateRatio) and every tensor (ExplodingTensor)
    for name in ("ExplodingTensor", "WeightUpdateRatio"):
        assert exploding[name].status.value == "IssuesFound", (name, exploding[name].status_details)
    # the ReLU outputs turn NaN within a few batches: that is divergence (ExplodingTensor's
    # finding), not dead ReLUs, and DeadRelu must not call them dead
    assert exploding["DeadRelu"].status.value != "IssuesFound", exploding["DeadRelu"].status_details
    assert (
        "RuleEvaluationConditionMet: Evaluation of the rule ExplodingTensor"
        in exploding["ExplodingTensor"].status_details
    )


def test_not_normalized_data_reads_the_keras_models_inputs(tmp_path):
    """The Keras hook files the model's own inputs in model_inputs (what `trainguard run --rules`
    asks for); the rule finds them although Keras's parameter names do not carry the model's. A
    property of the data is advice (rules/advice.py): NoIssuesFound with details 'Advice: ...'."""
    unnormalized = _run(tmp_path, "unnormalized", ["NotNormalizedData"])["NotNormalizedData"]
    assert unnormalized.status.value == "NoIssuesFound", unnormalized.status_details
    assert unnormalized.status_details.startswith("Advice: NotNormalizedData"), unnormalized.status_details
    healthy = _run(tmp_path, "healthy", ["NotNormalizedData"])["NotNormalizedData"]
    assert healthy.status.value == "NoIssuesFound", healthy.status_details
    assert not healthy.status_details.startswith("Advice"), healthy.status_details
    trial = create_trial(str(tmp_path / "healthy"))
    assert trial.tensor_names(collection="model_inputs") == ["sequential_input_0"]
