"""``trainguard submit`` against the real API process, and the example job specs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services.conftest import CUSTOM_RULE, HOOK_EVERY_STEP, REPO, training_command

EXAMPLES = REPO / "examples" / "jobs"


def _submit(api, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "TRAINGUARD_API_TOKEN": api.token, "NO_PROXY": "127.0.0.1,localhost"}
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "submit", *args, "--api", api.url],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.mark.slow
def test_submit_yaml_and_wait_for_a_faulty_job(api, tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    spec = {
        "name": "cli-faulty",
        "command": training_command("--steps", "400", "--blowup-at", "3", "--step-seconds", "0.05"),
        "hook_config": HOOK_EVERY_STEP,
        "rules": [
            {"rule": CUSTOM_RULE, "name": "LossBlowup", "actions": [{"name": "stoptraining", "grace_seconds": 5}]}
        ],
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    finished = _submit(api, str(path), "--wait")
    assert finished.returncode == 1, finished.stdout + finished.stderr
    assert "submitted cli-faulty: InProgress (Starting)" in finished.stdout
    # the finding itself (step, worker, message), not SageMaker's generic RuleEvaluationConditionMet
    found = re.search(r"rule LossBlowup: IssuesFound at step (\d+)(?: on worker_0)?: (\S+) = (\S+) exceeds", finished.stdout)
    assert found and int(found.group(1)) >= 3, finished.stdout
    assert "RuleEvaluationConditionMet" not in finished.stdout
    assert "fix: The loss blew up" in finished.stdout
    assert "cli-faulty: Stopped (Stopped)" in finished.stdout


def test_submit_json_healthy_job_without_wait_then_errors(api, tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"name": "cli-healthy", "command": training_command("--steps", "2")}))
    finished = _submit(api, str(path))
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.startswith("submitted cli-healthy: InProgress")

    again = _submit(api, str(path))
    assert again.returncode == 2 and "HTTP 409" in again.stderr and "already exists" in again.stderr

    path.write_text(json.dumps({"name": "cli-bad", "command": ["true"], "rules": [{"rule": "NoSuchRule"}]}))
    invalid = _submit(api, str(path))
    assert invalid.returncode == 2
    assert "HTTP 422" in invalid.stderr and "rules.0: rule: unknown rule 'NoSuchRule'" in invalid.stderr

    environment = {**os.environ, "TRAINGUARD_API_TOKEN": ""}
    no_token = subprocess.run([sys.executable, "-m", "trainguard.cli", "submit", str(path), "--api", api.url],
                              env=environment, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert no_token.returncode == 2 and "no API token" in no_token.stderr


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*") if p.suffix in (".yaml", ".json")))
def test_example_job_specs_are_valid(example: str) -> None:
    from trainguard.services.api.sagemaker import job_spec_from_request
    from trainguard.services.api.schemas import JobSpec
    from trainguard.rules import rule_names

    path = EXAMPLES / example
    document = (
        pytest.importorskip("yaml").safe_load(path.read_text())
        if path.suffix == ".yaml"
        else json.loads(path.read_text())
    )
    if "ExplodingTensor" not in rule_names():
        pytest.skip("the built-in rules are not installed in this checkout")
    if "TrainingJobName" in document:
        from trainguard.services.sagemaker_container.contract import CONTRACT_ENV, JobContract

        spec = job_spec_from_request(document)[0]
        assert spec.rules[0].actions == [{"name": "stoptraining", "training_job_prefix": document["TrainingJobName"]}]
        # SageMaker jobs run through the container-contract runner; the script is the contract's command
        command = list(JobContract.from_json(spec.environment[CONTRACT_ENV]).command)
    else:
        command = JobSpec.model_validate(document).command
    assert command and (REPO / command[1]).exists()
