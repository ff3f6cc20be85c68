"""The runs users reported (issue 11), as regression tests through the real CLI and endpoint.

Healthy training must never be stopped by ``trainguard run --rules --stop-on-issue`` (a tiny
Hugging Face ``Trainer`` run whose attention key biases get an exactly-zero gradient; a plain MLP
loop without validation on noisy mini-batches), and SageMaker's own LossNotDecreasing
configuration must stay silent on a noisy healthy run submitted through the SageMaker endpoint;
the learning-rate-100 variant of each must be found (and, under --stop-on-issue, stopped).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "rules" / "reported_scripts"


def _run(out: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "trainguard.cli", "run", "--out", str(out), "--rules", "--stop-on-issue", "--",
               sys.executable, str(SCRIPTS / script), *args]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=600)


def _outputs(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (out / "rule-output").glob("*.json")}


def _assert_silent(result: subprocess.CompletedProcess, out: Path) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not (out / "trainguard-stop.json").exists()
    outputs = _outputs(out)
    assert outputs and all(not doc["findings"] for doc in outputs.values()), {
        name: doc["findings"][:1] for name, doc in outputs.items() if doc["findings"]
    }
    assert "0 found issues" in result.stdout


def _assert_stopped(result: subprocess.CompletedProcess, out: Path, steps: int) -> dict:
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads((out / "trainguard-stop.json").read_text())
    assert record["certain"] is True and record["step"] < steps
    return record


@pytest.mark.slow
def test_mlp_loop_without_validation_is_not_stopped_and_its_lr_100_variant_is(tmp_path: Path) -> None:
    healthy = _run(tmp_path / "healthy", "mlp_no_validation.py", "--steps", "400")
    _assert_silent(healthy, tmp_path / "healthy")
    # the loss rule judged the run (40 saved losses), it did not merely lack data
    assert _outputs(tmp_path / "healthy")["LossNotDecreasing"]["status"] == "NoIssuesFound"
    faulty = _run(tmp_path / "lr100", "mlp_no_validation.py", "--steps", "400", "--lr", "100")
    record = _assert_stopped(faulty, tmp_path / "lr100", 400)
    assert record["configuration_name"] == "ExplodingTensor"


@pytest.mark.slow
def test_tiny_hugging_face_trainer_is_not_stopped_and_its_lr_100_variant_is(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    healthy = _run(tmp_path / "healthy", "hf_tiny_bert.py", "--steps", "120")
    _assert_silent(healthy, tmp_path / "healthy")
    outputs = _outputs(tmp_path / "healthy")
    # the rules that once fired at step 0 on the key biases judged every saved step
    for rule in ("VanishingGradient", "PoorWeightInitialization", "ExplodingTensor"):
        assert outputs[rule]["status"] == "NoIssuesFound", outputs[rule]
    faulty = _run(tmp_path / "lr100", "hf_tiny_bert.py", "--steps", "300", "--lr", "100")
    _assert_stopped(faulty, tmp_path / "lr100", 300)


@pytest.mark.slow
@pytest.mark.parametrize("epochs", [5, 8])
def test_many_epoch_trainer_with_evaluation_each_epoch_is_not_stopped_and_its_lr_100_twin_is(
    tmp_path: Path, epochs: int
) -> None:
    # issue 43: Overfit once stopped the healthy run at epoch 5 (certain), comparing the one EVAL
    # batch saved of each 8-batch pass with another batch of the next pass
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    healthy = _run(tmp_path / "healthy", "hf_tiny_bert.py", "--epochs", str(epochs), "--steps", "40")
    _assert_silent(healthy, tmp_path / "healthy")
    assert _outputs(tmp_path / "healthy")["Overfit"]["status"] != "IssuesFound"
    faulty = _run(tmp_path / "lr100", "hf_tiny_bert.py", "--epochs", str(epochs), "--steps", "40", "--lr", "100")
    record = _assert_stopped(faulty, tmp_path / "lr100", 40 * epochs + 8 * epochs)
    # the primary is the learning rate's own symptom, and its fix is the one shown
    assert record["rule"] in ("ExplodingTensor", "WeightUpdateRatio", "LossNotDecreasing"), record
    assert "learning rate" in record["fix_hint"], record
    fix = next(line for line in faulty.stdout.splitlines() if line.startswith("  fix         : "))
    assert record["fix_hint"] in fix


@pytest.mark.slow
def test_a_learning_rate_far_too_high_is_stopped_naming_the_learning_rate_not_a_consequence(tmp_path: Path) -> None:
    # sigmoid MLP, SGD lr=100: the update ratios explode first (not certain yet), the sigmoids then
    # saturate and their gradients vanish; the certain saturation triggers the stop, but the stop,
    # its record and the first fix shown are the cause's
    healthy = _run(tmp_path / "healthy", "sigmoid_mlp.py", "--steps", "300")
    _assert_silent(healthy, tmp_path / "healthy")
    faulty = _run(tmp_path / "lr100", "sigmoid_mlp.py", "--steps", "300", "--lr", "100")
    record = _assert_stopped(faulty, tmp_path / "lr100", 300)
    assert record["rule"] in ("WeightUpdateRatio", "ExplodingTensor"), record
    assert "learning rate" in record["fix_hint"] and "ReLU" not in record["fix_hint"], record
    trigger = record["triggered_by"]
    assert trigger["certain"] is True and trigger["step"] == record["step"]
    if trigger["rule"] != record["rule"]:
        assert f"training was stopped by {record['configuration_name']} at step {record['step']} (the diagnosis; " \
               f"triggered by {trigger['configuration_name']}'s certain finding)" in faulty.stdout  # fmt: skip
    diagnosis = next(line for line in faulty.stdout.splitlines() if line.startswith("  diagnosis   : "))
    fix = next(line for line in faulty.stdout.splitlines() if line.startswith("  fix         : "))
    assert diagnosis.startswith(f"  diagnosis   : {record['rule']} at step ") and record["fix_hint"] in fix


@pytest.mark.slow
def test_images_in_unit_range_are_advice_on_the_healthy_twin_and_not_the_diagnosis_of_the_faulty_one(
    tmp_path: Path,
) -> None:
    # ToTensor() alone (mean ~0.35): the data rules advise on both twins; the healthy one is no
    # issue (exit 0, nothing stopped), the lr=1e4 one is stopped naming the learning rate
    healthy = _run(tmp_path / "healthy", "unit_image_cnn.py")
    assert healthy.returncode == 0, healthy.stdout[-3000:] + healthy.stderr[-3000:]
    assert not (tmp_path / "healthy" / "trainguard-stop.json").exists()
    outputs = _outputs(tmp_path / "healthy")
    advised = {name for name, doc in outputs.items() if doc["findings"]}
    assert advised and advised <= {"NotNormalizedData", "CheckInputImages"}, advised
    assert all(f["advice"] for name in advised for f in outputs[name]["findings"])
    assert {outputs[name]["status"] for name in advised} == {"NoIssuesFound"}
    assert outputs[sorted(advised)[0]]["status_details"].startswith("Advice: ")
    assert "0 found issues" in healthy.stdout and "gave advice" in healthy.stdout
    assert "  diagnosis   :" not in healthy.stdout and "  advice      : " in healthy.stdout
    faulty = _run(tmp_path / "lr1e4", "unit_image_cnn.py", "--lr", "1e4")
    record = _assert_stopped(faulty, tmp_path / "lr1e4", 200)
    assert record["rule"] not in advised and "learning rate" in record["fix_hint"], record


@pytest.mark.slow
def test_unscaled_inputs_are_advice_and_not_the_diagnosis_of_sgd_on_unscaled_targets(tmp_path: Path) -> None:
    # raw feature scales of 10-100 in both programs: the data advice is all the healthy one gets; the
    # bug report's program (targets of order 1e4, plain SGD) overflows and is stopped naming that,
    # while the data advice is promoted to a finding beside it (it was the primary before)
    healthy = _run(tmp_path / "healthy", "bug_reports.py", "--bug", "none")
    assert healthy.returncode == 0, healthy.stdout[-3000:] + healthy.stderr[-3000:]
    assert "0 found issues, 1 gave advice" in healthy.stdout and "  diagnosis   :" not in healthy.stdout
    assert _outputs(tmp_path / "healthy")["NotNormalizedData"]["status"] == "NoIssuesFound"
    faulty = _run(tmp_path / "targets", "bug_reports.py", "--bug", "unscaled_targets")
    record = _assert_stopped(faulty, tmp_path / "targets", 300)
    assert record["rule"] != "NotNormalizedData" and "learning rate" in record["fix_hint"], record
    diagnosis = _outputs(tmp_path / "targets")["NotNormalizedData"]["diagnosis"]
    assert diagnosis["primary"][0]["rule"] == record["rule"] and diagnosis["advice"] == []
    assert diagnosis["this_rule"] in ("possible_cause", "other")
