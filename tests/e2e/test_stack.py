"""End to end on the real compose stack: real Docker engine, real PyTorch training containers,
rule-runner containers, the uploader, moto as S3, the control API in a container.

Skipped with the reason where Docker cannot be had (not root, no engine); CI (root) runs them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.e2e.docker_env import (
    TRAINING_IMAGE,
)
from tests.e2e.stack import REPO, TOKEN, Stack, job_spec, running_stack, volume_files, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    yield from running_stack()


def _name(kind: str) -> str:
    return f"e2e-{kind}-{uuid.uuid4().hex[:6]}"


def test_faulty_job_is_found_by_its_rule_container_and_stopped(stack):  # noqa: ANN001
    name = _name("faulty")
    # lr 5 blows the weights up to inf/NaN within a few steps; 200 steps would take 10 s+.
    stack.submit(job_spec(name, lr=5.0, steps=200, email="oncall@example.com"))
    job = stack.wait_settled(name)
    assert job["status"] == "Stopped", job
    assert "ExplodingTensor" in (job["stop_cause"] or "")
    rule = job["rules"][0]
    assert rule["status"] == "IssuesFound"
    assert rule["findings"] and rule["findings"][0]["fired"] is True
    assert "learning rate" in rule["findings"][0]["fix_hint"]
    assert [t["status"] for t in job["secondary_status_transitions"]][-2:] == ["Stopping", "Stopped"]
    _rule_output_status_is(stack, name, "IssuesFound")
    # The training container really ran PyTorch, hit the fault, and was stopped long before the end.
    log = stack.logs(name)
    assert "first non-finite loss at step" in log and "trainguard-demo: done" not in log
    # The email action went through the stack's SMTP sink (it prints every message it receives).
    wait_for(lambda: name in stack.compose("logs", "smtp").stdout, 60, "the email action's message at the sink")


def test_healthy_job_completes_with_no_issues_and_its_run_is_on_s3(stack):  # noqa: ANN001
    name = _name("healthy")
    stack.submit(job_spec(name, lr=0.01, steps=20))
    job = stack.wait_settled(name)
    assert job["status"] == "Completed", job
    assert job["rules"][0]["status"] == "NoIssuesFound", job["rules"]
    transitions = [t["status"] for t in job["secondary_status_transitions"]]
    assert transitions == ["Starting", "Training", "Uploading", "Completed"]
    on_s3 = stack.s3_objects(f"jobs/{name}/debug-output")
    assert on_s3 == volume_files(f"tg-{name}-tensors")
    assert "training_job_end.ts" in on_s3 and len([k for k in on_s3 if k.startswith("index/")]) == 20
    # the rule container's rule-output file, next to debug-output (SageMaker's layout; reports read it)
    _rule_output_status_is(stack, name, "NoIssuesFound")


def _rule_output_status_is(stack, name: str, status: str) -> None:  # noqa: ANN001
    prefix = f"jobs/{name}/rule-output"
    wait_for(lambda: stack.s3_objects(prefix), 60, f"the rule container's file under {prefix}/")
    (key,) = stack.s3_objects(prefix)
    document = json.loads(stack.s3().get_object(Bucket="trainguard", Key=f"{prefix}/{key}")["Body"].read())
    assert key.endswith(".json") and document["status"] == status, document


def test_boto3_sagemaker_client_drives_the_stack(stack):  # noqa: ANN001
    name = _name("sagemaker")
    client = stack.sagemaker()
    # action_json as the SageMaker SDK serialises it: backslashes before the quotes.
    action_json = '[{\\"name\\": \\"stoptraining\\", \\"training_job_prefix\\": \\"' + name + '\\"}]'
    client.create_training_job(
        TrainingJobName=name,
        RoleArn="arn:aws:iam::111122223333:role/trainguard",
        AlgorithmSpecification={
            "TrainingImage": TRAINING_IMAGE, "TrainingInputMode": "File",
            "ContainerEntrypoint": ["python", "train_demo.py"],
            "ContainerArguments": ["--lr", "5", "--steps", "200", "--step-sleep", "0.05"],
        },
        OutputDataConfig={"S3OutputPath": "s3://trainguard/sagemaker"},
        ResourceConfig={"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        StoppingCondition={"MaxRuntimeInSeconds": 600},
        DebugHookConfig={"S3OutputPath": "s3://trainguard/sagemaker", "HookParameters": {"save_interval": "1"}},
        DebugRuleConfigurations=[{
            "RuleConfigurationName": "Exploding",
            "RuleEvaluatorImage": "895741380848.dkr.ecr.us-west-2.amazonaws.com/sagemaker-debugger-rules:latest",
            "RuleParameters": {"rule_to_invoke": "ExplodingTensor",
                               "action_json": action_json},
        }],
    )  # fmt: skip
    stack.jobs.append(name)

    def stopped() -> dict | None:
        description = client.describe_training_job(TrainingJobName=name)
        statuses = description.get("DebugRuleEvaluationStatuses", [])
        issues = bool(statuses) and statuses[0]["RuleEvaluationStatus"] == "IssuesFound"
        done = description["TrainingJobStatus"] == "Stopped" and issues
        return description if done else None

    description = wait_for(stopped, 180, f"{name} to be Stopped with IssuesFound")
    assert description["SecondaryStatus"] == "Stopped"
    assert description["DebugRuleEvaluationStatuses"][0]["RuleConfigurationName"] == "Exploding"
    listed = client.list_training_jobs(NameContains=name)["TrainingJobSummaries"]
    assert [j["TrainingJobName"] for j in listed] == [name]


def test_api_restart_during_a_job_still_follows_it_to_the_end(stack):  # noqa: ANN001
    name = _name("restart")
    stack.submit(job_spec(name, lr=0.01, steps=80, step_sleep=0.1))
    wait_for(lambda: stack.job(name)["secondary_status"] == "Training", 120, f"{name} to be Training")
    started = time.monotonic()
    stack.compose("restart", "api")
    stack.compose("up", "-d", "--wait", "api")  # healthy again
    assert time.monotonic() - started < 60
    assert stack.job(name)["status"] == "InProgress", "the job should outlive the API restart"
    job = stack.wait_settled(name)
    assert job["status"] == "Completed", job
    assert job["rules"][0]["status"] == "NoIssuesFound"
    assert "trainguard-demo: done" in stack.logs(name)


def test_uploader_killed_mid_run_and_restarted_loses_no_file(stack):  # noqa: ANN001
    import docker

    name = _name("upkill")
    prefix = f"jobs/{name}/debug-output"
    stack.submit(job_spec(name, lr=0.01, steps=100, step_sleep=0.1))
    wait_for(lambda: len(stack.s3_objects(prefix)) >= 10, 120, "the uploader to have uploaded some steps")
    client = docker.from_env()
    uploader = client.containers.get(f"tg-{name}-uploader")
    uploader.kill()  # SIGKILL, mid-run
    uploader.reload()
    assert uploader.status == "exited"
    assert stack.job(name)["status"] == "InProgress", "training goes on without the uploader"
    uploader.start()  # restarted: resumes from its state file in the job's volume
    job = stack.wait_settled(name)
    assert job["status"] == "Completed", job
    on_s3 = stack.s3_objects(prefix)
    assert on_s3 == volume_files(f"tg-{name}-tensors")  # every file, byte-identical (MD5 ETags)
    assert len([k for k in on_s3 if k.startswith("index/")]) == 100
    client.close()


def test_readme_path_trainguard_submit_example_job(stack):  # noqa: ANN001
    """The README's one command: `trainguard submit examples/jobs/faulty.yaml --wait` on the stack."""
    name = _name("example")
    stack.jobs.append(name)
    result = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "submit", "examples/jobs/faulty.yaml", "--name", name,
         "--api", stack.url, "--token", TOKEN, "--wait", "--timeout", "240"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    # --wait exits 1 for a job that was stopped by its rule.
    assert result.returncode == 1, result.stdout + result.stderr
    job = stack.job(name)
    assert job["status"] == "Stopped", job
    assert job["rules"][0]["status"] == "IssuesFound"
    assert "Stopped" in result.stdout
