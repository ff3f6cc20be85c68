"""PoorWeightInitialization judges each model of a run on its own (issue 43): a GAN's generator and
discriminator (two optimizers) are never compared as one model's layers, and a model whose
activations a normalisation layer rescales is not judged by its layers' variance ratio.

Real runs through ``trainguard run`` (no trainguard code in the scripts), judged afterwards."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.rules import RuleSpec
from trainguard.rules.runner import RuleRunner
from trainguard.trials import create_trial

SCRIPTS = Path(__file__).with_name("healthy_scripts")


def _capture(tmp_path: Path, script: str) -> Path:
    out = tmp_path / "run"
    command = [sys.executable, "-m", "trainguard.cli", "run", "--save-interval", "5", "--out", str(out),
               "--", sys.executable, str(SCRIPTS / script)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return out


def _verdict(tmp_path: Path, run: Path) -> tuple[str, str]:
    final = RuleRunner(
        str(run), [RuleSpec("PoorWeightInitialization")], output_dir=str(tmp_path / "rules"), poll_interval=0.05
    ).run()
    update = final["PoorWeightInitialization"]
    return update.status.value, update.status_details or ""


@pytest.mark.parametrize("script", ["dcgan_tutorial.py", "two_scales.py"])
def test_a_gan_s_models_are_judged_apart_and_stay_silent(tmp_path: Path, script: str) -> None:
    run = _capture(tmp_path, script)
    trial = create_trial(str(run))
    scopes = trial.model_scopes
    assert len(scopes) == 2, scopes  # the hook said which tensors are whose
    status, details = _verdict(tmp_path, run)
    assert status == "NoIssuesFound" and not details.startswith("Advice"), details


def test_two_models_with_the_same_child_names_get_distinct_tensor_names(tmp_path: Path) -> None:
    """The tutorial DCGAN: Generator.main and Discriminator.main; smdebug's names would write both
    models' ``main.2`` as one tensor."""
    trial = create_trial(str(_capture(tmp_path, "dcgan_tutorial.py")))
    names = trial.tensor_names(collection="relu_input")
    assert len(names) == 4, names  # two ReLUs in the generator, two LeakyReLUs in the discriminator
    later = [model for model, heads in trial.model_scopes.items() if heads == [model]]
    assert len(later) == 1  # the root met second has its name as a prefix
    assert sum(name.startswith(f"{later[0]}.") for name in names) == 2
