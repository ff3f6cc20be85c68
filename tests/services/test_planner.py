"""The job planner: which components each launcher gets, with the service contract's environment."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from trainguard.services.api.planner import plan_job
from trainguard.services.api.schemas import JobSpec, RuleConfig
from trainguard.services.api.settings import Settings
from tests.services.conftest import CUSTOM_RULE


def _settings(tmp_path: Path, **extra: str) -> Settings:
    environ = {"TRAINGUARD_API_TOKEN": "planner-token", "TRAINGUARD_DATA_DIR": str(tmp_path), **extra}
    return Settings.from_env(environ)


SPEC = JobSpec.model_validate(
    {
        "name": "plan-me",
        "image": "my-training:1",
        "command": ["python", "train.py"],
        "environment": {"LR": "0.1"},
        "resources": {"cpus": 2, "memory_mb": 4096},
        "hook_config": {"S3OutputPath": "s3://bkt/out/", "HookParameters": {"save_interval": "5"}},
        "rules": [
            {"rule": CUSTOM_RULE, "name": "Loss", "parameters": {"threshold": 5}, "actions": [{"name": "stoptraining"}]}
        ],
    }
)


def test_docker_plan_follows_the_service_contract(tmp_path: Path) -> None:
    settings = _settings(tmp_path, S3_ENDPOINT_URL="http://s3:5000", TRAINGUARD_PUBLIC_URL="http://api:8080",
                         CLOUDWATCH_ENDPOINT_URL="http://s3:5000", TRAINGUARD_RULE_CPUS="0.25")  # fmt: skip
    launch = plan_job(SPEC, settings, "docker", "runner-token")
    training, uploader, rule = launch.components
    assert (training.role, training.image, training.command) == ("training", "my-training:1", ("python", "train.py"))
    assert (training.cpus, training.memory_mb) == (2, 4096)
    assert training.volumes == {"tg-plan-me-tensors": "/opt/ml/output/tensors"} == uploader.volumes
    assert json.loads(training.environment["TRAINGUARD_HOOK_CONFIG_JSON"])["HookParameters"] == {"save_interval": "5"}
    assert training.environment["LR"] == "0.1" and training.environment["TRAINING_JOB_NAME"] == "plan-me"
    assert uploader.command == ("python", "-m", "trainguard.services.uploader", "--source", "/opt/ml/output/tensors",
                                "--dest", "s3://bkt/out/plan-me/debug-output", "--endpoint-url", "http://s3:5000")  # fmt: skip
    assert rule.role == "rule:Loss" and rule.image == "trainguard-service:local" and rule.cpus == 0.25
    assert rule.command == ("python", "-m", "trainguard.services.rule_runner")
    environment = rule.environment
    assert environment["BASE_TRIAL"] == "s3://bkt/out/plan-me/debug-output"
    assert environment["RULE_TO_INVOKE"] == CUSTOM_RULE
    assert json.loads(environment["RULE_PARAMETERS_JSON"]) == {"threshold": "5"}
    assert environment["TRAINGUARD_API_URL"] == "http://api:8080"
    assert environment["TRAINGUARD_API_TOKEN"] == "runner-token"
    assert environment["RULE_CONFIGURATION_NAME"] == "Loss"
    assert json.loads(environment["RULE_ACTIONS_JSON"]) == [{"name": "stoptraining"}]
    assert environment["CLOUDWATCH_ENDPOINT_URL"] == "http://s3:5000"
    # The API's own secret never reaches a component.
    assert "planner-token" not in json.dumps([dict(c.environment) for c in launch.components])


def test_docker_plan_needs_an_s3_output(tmp_path: Path) -> None:
    spec = SPEC.model_copy(update={"hook_config": {"HookParameters": {"save_interval": "5"}}})
    with pytest.raises(ValueError, match="S3OutputPath"):
        plan_job(spec, _settings(tmp_path), "docker", "t")
    launch = plan_job(spec, _settings(tmp_path, TRAINGUARD_S3_OUTPUT="s3://default"), "docker", "t")
    assert launch.components[1].command[6] == "s3://default/plan-me/debug-output"


def test_local_plan_runs_the_command_under_trainguard_run(tmp_path: Path) -> None:
    launch = plan_job(SPEC, _settings(tmp_path), "local", "runner-token")
    training, uploader, rule = launch.components
    tensors = str(tmp_path / "jobs" / "plan-me" / "debug-output")
    # the hook config names an S3 output: the local run is uploaded there too
    assert uploader.role == "uploader" and uploader.command[1:3] == ("-m", "trainguard.services.uploader")
    assert uploader.command[uploader.command.index("--source") + 1] == tensors
    assert uploader.command[uploader.command.index("--dest") + 1] == "s3://bkt/out/plan-me/debug-output"
    assert training.command[:4] == (sys.executable, "-m", "trainguard.cli", "run")
    assert training.command[-3:] == ("--", "python", "train.py")
    config = Path(training.command[training.command.index("--config") + 1])
    assert json.loads(config.read_text())["LocalPath"] == tensors
    assert rule.environment["BASE_TRIAL"] == tensors
    assert rule.environment["RULE_OUTPUT_DIR"] == str(tmp_path / "jobs" / "plan-me")


def test_a_private_ca_bundle_reaches_the_local_plans_s3_clients_not_containers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The service trusts its S3 endpoint through a private CA: the local uploader and rule runners
    # (same machine, same files) must trust it too; a container's file system lacks that path.
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
    _, uploader, rule = plan_job(SPEC, _settings(tmp_path), "local", "runner-token").components
    assert uploader.environment["AWS_CA_BUNDLE"] == str(bundle) == rule.environment["AWS_CA_BUNDLE"]
    docker = plan_job(SPEC, _settings(tmp_path, S3_ENDPOINT_URL="https://s3:5000"), "docker", "t")
    assert all("AWS_CA_BUNDLE" not in component.environment for component in docker.components)


def _saved_collections(launch) -> list[dict]:
    training = launch.components[0]
    return json.loads(Path(training.command[training.command.index("--config") + 1]).read_text()).get(
        "CollectionConfigurations"
    )


def test_the_hook_config_saves_what_the_built_in_rules_read(tmp_path: Path) -> None:
    # A hook config naming no collections: zero-code capture's defaults, and the rules' on top
    # (SaturatedActivation reads tanh_input, which the defaults do not save)
    rules = [{"rule": "SaturatedActivation"}, {"rule": "ReplicaDivergence"}, {"rule": CUSTOM_RULE, "name": "Loss"}]
    spec = SPEC.model_copy(update={"rules": [RuleConfig.model_validate(rule) for rule in rules]})
    names = [entry["CollectionName"] for entry in _saved_collections(plan_job(spec, _settings(tmp_path), "local", "t"))]
    assert names[:2] == ["weights", "biases"] and {"tanh_input", "sigmoid_input", "replica_fingerprints"} <= set(names)
    assert len(names) == len(set(names))
    # a config naming its collections keeps them as given (their parameters too), the rules' added
    listed = {**spec.hook_config, "CollectionConfigurations": [
        {"CollectionName": "tanh_input", "CollectionParameters": {"save_interval": "7"}}]}  # fmt: skip
    entries = _saved_collections(plan_job(spec.model_copy(update={"hook_config": listed}), _settings(tmp_path),
                                          "local", "t"))  # fmt: skip
    assert entries[0] == {"CollectionName": "tanh_input", "CollectionParameters": {"save_interval": "7"}}
    assert [entry["CollectionName"] for entry in entries][1:] == ["sigmoid_input", "replica_fingerprints"]
    # only a plug-in rule (its collections unknown here): the document is the user's
    assert _saved_collections(plan_job(SPEC, _settings(tmp_path), "local", "t")) is None
