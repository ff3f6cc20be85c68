"""Saturating initialisations are found (issue 43 item 6): tanh and sigmoid MLPs initialised
N(0, 3²) put most pre-activations where the activation is flat from the first step;
PoorWeightInitialization reports it (advice: the run may still learn, slowly), and a run that
shows a learning symptom gets it as a candidate cause. Their Xavier twins stay silent.

Real runs through ``trainguard run`` (no trainguard code in the script), judged afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainguard.rules import RuleSpec
from trainguard.rules.builtin.saturated_activation import flat_bound
from trainguard.rules.runner import RuleRunner

SCRIPT = Path(__file__).with_name("healthy_scripts") / "saturating_mlp.py"


@pytest.mark.parametrize("derivative", [0.01, 0.1, 0.5])
def test_the_flat_bound_is_where_the_derivative_falls_below_its_share(derivative: float) -> None:
    tanh_bound, sigmoid_bound = flat_bound("tanh", derivative), flat_bound("sigmoid", derivative)
    assert 1 - np.tanh(tanh_bound) ** 2 == pytest.approx(derivative)  # tanh' peaks at 1
    sigmoid = 1 / (1 + np.exp(-sigmoid_bound))
    assert sigmoid * (1 - sigmoid) / 0.25 == pytest.approx(derivative)  # sigmoid' peaks at 1/4


def _capture(tmp_path: Path, *script_args: str, rules: bool = False) -> tuple[Path, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "run"
    options = ["--rules"] if rules else ["--save-interval", "5"]
    command = [sys.executable, "-m", "trainguard.cli", "run", *options, "--out", str(out),
               "--", sys.executable, str(SCRIPT), *script_args]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    return out, done.stdout


def _judge(tmp_path: Path, run: Path) -> tuple[list[dict], str, str]:
    """The findings PoorWeightInitialization reported (as dicts), its final status and details."""
    results: list[dict] = []
    final = RuleRunner(
        str(run), [RuleSpec("PoorWeightInitialization")], output_dir=str(tmp_path / "rules"), poll_interval=0.05,
        on_update=lambda update: results.append(update.result.to_dict()) if update.result is not None else None,
    ).run()["PoorWeightInitialization"]  # fmt: skip
    return [result for result in results if result["fired"]], final.status.value, final.status_details or ""


@pytest.mark.parametrize("activation", ["tanh", "sigmoid"])
def test_a_saturating_initialisation_is_found_and_its_xavier_twin_is_silent(tmp_path: Path, activation: str) -> None:
    run, _ = _capture(tmp_path / "normal", activation, "normal", "--std", "3")
    fired, status, details = _judge(tmp_path / "normal", run)
    assert fired, "N(0, 3²) not found"
    assert status == "NoIssuesFound" and details.startswith("Advice:"), (status, details)
    first = fired[0]
    assert f"where {activation} is flat" in first["message"], first["message"]
    assert first["advice"] is True and first["certain"] is False  # a property of the init: advice
    assert first["details"]["saturated_share"] > 0.5
    run, _ = _capture(tmp_path / "xavier", activation, "xavier")
    fired, status, details = _judge(tmp_path / "xavier", run)
    assert not fired and status == "NoIssuesFound" and not details.strip(), (status, details)


def test_a_saturated_stack_that_does_not_learn_gets_it_as_a_cause(tmp_path: Path) -> None:
    """A learning rate of 0: nothing changes, so the saturation is no longer a mere property."""
    run, _ = _capture(tmp_path, "tanh", "normal", "--std", "3", "--lr", "0", "--steps", "200", rules=True)
    command = [sys.executable, "-m", "trainguard.cli", "rules", "run", str(run), "--json",
               "--output-dir", str(tmp_path / "judged"), "--rule", "PoorWeightInitialization",
               "--rule", "WeightUpdateRatio", "--rule", "LossNotDecreasing"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    diagnosis = json.loads(done.stdout.splitlines()[-1])["diagnosis"]
    findings = [entry for key in ("primary", "possible_causes", "other") for entry in diagnosis.get(key, [])]
    assert any(entry["rule"] == "PoorWeightInitialization" for entry in findings), diagnosis
    assert not any(entry["rule"] == "PoorWeightInitialization" for entry in diagnosis.get("advice", []))
