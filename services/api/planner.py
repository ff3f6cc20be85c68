"""Job spec -> JobLaunch: the components a launcher starts for one job.

Local launcher: the training command runs under ``trainguard run`` writing to
``<data dir>/jobs/<job>/debug-output``; each rule runner reads that directory.
Docker launcher: the training image's entrypoint does the capture into the named volume
``tg-<job>-tensors``; an uploader copies it to ``<S3OutputPath>/<job>/debug-output``, which the
rule-runner containers read (the service contract in the helper notes).
Ray launcher: the local plan on nodes sharing the data directory; when the hook config names an
``s3://`` output the rule runners read the uploader's S3 copy instead, and the training component
carries the job's instance count and GPUs (the launcher runs several instances under ray_ranks).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from trainguard.services.api.policy import SourcePolicy
from trainguard.services.api.schemas import JobSpec, RuleConfig
from trainguard.services.api.settings import Settings
from trainguard.services.launchers.base import ComponentSpec, JobLaunch
from trainguard.services.sagemaker_container.contract import CONTRACT_ENV, GPUS_BY_INSTANCE_TYPE
from trainguard.services.sagemaker_container.images import training_image_for
from trainguard.services.uploader.status import STATUS_FILE_NAME

__all__ = [
    "LOCAL_PLAN_LAUNCHERS",
    "RULE_ROLE_PREFIX",
    "UPLOADER_FINISH_GRACE_S",
    "gpus_per_instance",
    "instance_count",
    "job_dir",
    "plan_job",
    "rule_role",
    "tensors_location",
    "uploader_status_file",
]

RULE_ROLE_PREFIX = "rule:"
# Launchers that run the local plan (commands with this Python, the capture in the job directory);
# the ray launcher does, on nodes sharing that directory (docs/ray.md).
LOCAL_PLAN_LAUNCHERS = ("local", "ray")
CONTAINER_TENSORS = "/opt/ml/output/tensors"
_PASSED_AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
# Processes of the local plan also see this machine's files: the CA bundle the service trusts for
# its S3 endpoint (a private CA) is the one they must trust. A container has its own file system,
# where that path means nothing, so the Docker plan does not get it.
_LOCAL_PLAN_AWS_VARIABLES = (*_PASSED_AWS_VARIABLES, "AWS_CA_BUNDLE")
# The grace of the stop that tells an uploader training is over (see the reconciler, which uses it).
UPLOADER_FINISH_GRACE_S = 660.0


def rule_role(configuration_name: str) -> str:
    return f"{RULE_ROLE_PREFIX}{configuration_name}"


def job_dir(settings: Settings, job_name: str) -> Path:
    return settings.data_dir / "jobs" / job_name


def uploader_status_file(settings: Settings, launcher: str, job_name: str) -> str:
    """Where a job's uploader keeps its status, as the launcher's ``read_file`` finds it: the
    uploader's default, in the ``--source`` the plan gives it (a path on this machine for the local
    plan, in the uploader's container for the Docker plan), so the plan passes no ``--status-file``
    and runs with any service image's uploader."""
    local = launcher in LOCAL_PLAN_LAUNCHERS
    source = str(job_dir(settings, job_name) / "debug-output") if local else CONTAINER_TENSORS
    return f"{source}/{STATUS_FILE_NAME}"


def tensors_location(settings: Settings, spec: JobSpec, launcher: str) -> str:
    """Where the job's tensors end up: what rule runners read as BASE_TRIAL."""
    if launcher in LOCAL_PLAN_LAUNCHERS:
        return str(job_dir(settings, spec.name) / "debug-output")
    base = ((spec.hook_config or {}).get("S3OutputPath") or settings.s3_output or "").rstrip("/")
    if not base.startswith("s3://"):
        raise ValueError(
            "hook_config.S3OutputPath: the docker launcher needs an s3:// output path "
            "(give DebugHookConfig.S3OutputPath or set TRAINGUARD_S3_OUTPUT)"
        )
    return f"{base}/{spec.name}/debug-output"


def _s3_debug_output(spec: JobSpec, settings: Settings) -> str | None:
    """``<S3OutputPath>/<job>/debug-output`` when the hook config names an s3:// output, else None."""
    base = str((spec.hook_config or {}).get("S3OutputPath") or "").rstrip("/")
    return f"{base}/{spec.name}/debug-output" if base.startswith("s3://") else None


def _hook_document(spec: JobSpec, local_path: str) -> dict[str, Any]:
    """The job's DebugHookConfig, saving what its built-in rules read besides what it names (as
    ``trainguard run --rules`` does): a config that names no collections keeps zero-code
    capture's defaults under the rules' ones; one that does keeps its entries as given."""
    document = dict(spec.hook_config or {})
    needed = _rule_collections(spec.rules)
    if needed:
        from trainguard.rules.defaults import BASE_COLLECTIONS

        listed = document.get("CollectionConfigurations")
        entries = list(listed) if isinstance(listed, list) and listed else [
            {"CollectionName": name} for name in BASE_COLLECTIONS]  # fmt: skip
        present = {entry.get("CollectionName") for entry in entries if isinstance(entry, dict)}
        entries.extend({"CollectionName": name} for name in needed if name not in present)
        document["CollectionConfigurations"] = entries
    document["LocalPath"] = local_path
    return document


def _rule_collections(rules: list[RuleConfig]) -> list[str]:
    """The collections the job's built-in debugger rules read (plug-ins and custom classes say
    nothing about theirs before they are loaded in their own runner)."""
    debugger = [rule.rule for rule in rules if rule.kind == "debug"]
    if not debugger:
        return []
    from trainguard.rules import builtin_rules
    from trainguard.rules.defaults import rule_collections

    available = builtin_rules()
    return rule_collections([available[name] for name in debugger if name in available])


def _rule_environment(
    spec: JobSpec, rule: RuleConfig, settings: Settings, base_trial: str, runner_token: str, run_dir: str | None
) -> dict[str, str]:
    parameters = {k: v if isinstance(v, str) else json.dumps(v) for k, v in rule.parameters.items()}
    environment = {
        "TRAINING_JOB_NAME": spec.name,
        "RULE_CONFIGURATION_NAME": rule.configuration_name,
        "RULE_TO_INVOKE": rule.rule,
        "RULE_PARAMETERS_JSON": json.dumps(parameters),
        "RULE_KIND": rule.kind,
        "RULE_ACTIONS_JSON": json.dumps(rule.actions),
        "BASE_TRIAL": base_trial,
        "AWS_REGION": settings.region,
        "TRAINGUARD_API_URL": settings.public_url,
        "TRAINGUARD_API_TOKEN": runner_token,
    }
    if rule.source_uri:
        environment["RULE_SOURCE_URI"] = rule.source_uri
    if settings.s3_endpoint_url:
        environment["S3_ENDPOINT_URL"] = settings.s3_endpoint_url
    if settings.cloudwatch_endpoint_url:
        environment["CLOUDWATCH_ENDPOINT_URL"] = settings.cloudwatch_endpoint_url
    if run_dir:
        environment["RULE_OUTPUT_DIR"] = run_dir
        environment["RULE_PROGRESS_FILE"] = str(Path(run_dir) / "rule-progress" / f"{rule.configuration_name}.json")
    return environment


def _contract_environment(spec: JobSpec, settings: Settings, base_dir: str) -> dict[str, str]:
    """What a job under SageMaker's container contract needs beside its own environment.

    The job-side runner reads the channels and writes the model to S3 itself, as a SageMaker
    training container does, so it gets the S3 endpoint and the credentials the service holds.
    """
    if CONTRACT_ENV not in spec.environment:
        return {}
    environment = {"SAGEMAKER_BASE_DIR": base_dir, "AWS_REGION": settings.region}
    if settings.s3_endpoint_url:
        environment["S3_ENDPOINT_URL"] = settings.s3_endpoint_url
    environment.update({key: os.environ[key] for key in _PASSED_AWS_VARIABLES if os.environ.get(key)})
    return environment


def _local_command(command: list[str]) -> list[str]:
    """The contract runner under this interpreter (``python`` on PATH may be another one)."""
    if command[:3] == ["python", "-m", "trainguard.services.sagemaker_container"]:
        return [sys.executable, *command[1:]]
    return command


def instance_count(spec: JobSpec) -> int:
    """Training instances: the native spec's ``resources.instance_count`` or, for a SageMaker job,
    its ``ResourceConfig.InstanceCount`` (carried in the container contract)."""
    count = spec.resources.instance_count
    contract_json = spec.environment.get(CONTRACT_ENV)
    if contract_json:
        try:
            count = max(count, int(json.loads(contract_json).get("instance_count") or 1))
        except (ValueError, TypeError, AttributeError):
            pass  # the contract runner reports an unreadable contract itself
    return count


def gpus_per_instance(spec: JobSpec) -> int | None:
    """``resources.gpus``, else a SageMaker job's instance type's GPUs (None: none asked for)."""
    if spec.resources.gpus is not None:
        return spec.resources.gpus
    try:
        instance_type = json.loads(spec.environment.get(CONTRACT_ENV) or "{}").get("instance_type") or ""
    except (ValueError, AttributeError):
        return None
    return GPUS_BY_INSTANCE_TYPE.get(instance_type) or None


def plan_job(spec: JobSpec, settings: Settings, launcher: str, runner_token: str) -> JobLaunch:
    """The components of ``spec`` for ``launcher`` ("local", "docker" or "ray")."""
    if spec.resources.instance_count > 1 and launcher != "ray":
        raise ValueError(
            f"resources.instance_count: {spec.resources.instance_count} instances need the ray launcher "
            f"(this API runs {launcher!r}: one instance per job)"
        )
    base_trial = tensors_location(settings, spec, launcher)
    hook_json = json.dumps(_hook_document(spec, base_trial if launcher == "local" else CONTAINER_TENSORS))
    training_environment = {
        **spec.environment,
        "TRAINING_JOB_NAME": spec.name,
        "TRAINGUARD_HOOK_CONFIG_JSON": hook_json,
    }
    if spec.profiler_config is not None:
        training_environment["TRAINGUARD_PROFILER_CONFIG_JSON"] = json.dumps(spec.profiler_config)
    components: list[ComponentSpec] = []
    if launcher in LOCAL_PLAN_LAUNCHERS:
        if not spec.command:
            raise ValueError("command: the local launcher runs a command, not an image: give the training command")
        directory = job_dir(settings, spec.name)
        directory.mkdir(parents=True, exist_ok=True)
        config_file = directory / "debughookconfig.json"
        config_file.write_text(hook_json)
        # Inside the job's own directory, never the API's working directory (policy checked it).
        working_dir = str(
            SourcePolicy.check_working_dir(spec.working_dir, directory) if spec.working_dir else directory
        )
        command = (
            sys.executable, "-m", "trainguard.cli", "run", "--out", base_trial, "--config", str(config_file),
            "--", *_local_command(spec.command),
        )  # fmt: skip
        components.append(
            ComponentSpec(
                role="training",
                image=spec.image or "",
                command=command,
                environment={**training_environment, **_contract_environment(spec, settings, str(directory / "ml"))},
                cpus=spec.resources.cpus,
                memory_mb=spec.resources.memory_mb,
                working_dir=working_dir,
                gpus=gpus_per_instance(spec) if launcher == "ray" else None,
                instance_count=instance_count(spec) if launcher == "ray" else 1,
            )
        )
        s3_copy = _s3_debug_output(spec, settings)
        if s3_copy:
            # The hook config names an S3 output (every SageMaker SDK job does): the run is also
            # uploaded there, so the debugger artifacts path DescribeTrainingJob reports
            # (create_trial(estimator.latest_job_debugger_artifacts_path())) holds it, as on SageMaker.
            # Local rules read the local directory (no round trip through S3 on one machine); Ray's
            # read the S3 copy, as the Docker plan's do, so a rules node needs no view of the
            # training node's files.
            uploader = [sys.executable, "-m", "trainguard.services.uploader", "--source", base_trial, "--dest", s3_copy]
            if settings.s3_endpoint_url:
                uploader += ["--endpoint-url", settings.s3_endpoint_url]
            aws = {key: os.environ[key] for key in _LOCAL_PLAN_AWS_VARIABLES if os.environ.get(key)}
            components.append(
                ComponentSpec(
                    role="uploader",
                    image=settings.service_image,
                    command=tuple(uploader),
                    environment={**aws, "AWS_REGION": settings.region},
                    working_dir=str(directory),
                    # Told to finish by a stop (SIGTERM): on Ray that stop's grace is the submitted one.
                    stop_grace_seconds=UPLOADER_FINISH_GRACE_S,
                )
            )
        rules_read = s3_copy if s3_copy and launcher == "ray" else base_trial
        rule_aws = {key: os.environ[key] for key in _LOCAL_PLAN_AWS_VARIABLES if os.environ.get(key)} if s3_copy else {}
        for rule in spec.rules:
            components.append(
                ComponentSpec(
                    role=rule_role(rule.configuration_name),
                    image=settings.service_image,
                    command=(sys.executable, "-m", "trainguard.services.rule_runner"),
                    environment={
                        **rule_aws,
                        **_rule_environment(spec, rule, settings, rules_read, runner_token, str(directory)),
                    },
                    working_dir=working_dir,
                )
            )
        return JobLaunch(spec.name, tuple(components), workspace=str(directory))

    volume = f"tg-{spec.name}-tensors"
    aws = {key: os.environ[key] for key in _PASSED_AWS_VARIABLES if os.environ.get(key)}
    training_environment.setdefault("TRAINGUARD_OUT_DIR", CONTAINER_TENSORS)
    components.append(
        ComponentSpec(
            role="training",
            image=training_image_for(spec.image, settings.training_image, settings.training_image_map),
            command=tuple(spec.command),
            environment={**training_environment, **_contract_environment(spec, settings, "/opt/ml")},
            cpus=spec.resources.cpus,
            memory_mb=spec.resources.memory_mb,
            volumes={volume: CONTAINER_TENSORS},
            working_dir=spec.working_dir,
        )
    )
    uploader = ["python", "-m", "trainguard.services.uploader", "--source", CONTAINER_TENSORS, "--dest", base_trial]
    if settings.s3_endpoint_url:
        uploader += ["--endpoint-url", settings.s3_endpoint_url]
    components.append(
        ComponentSpec(
            role="uploader",
            image=settings.service_image,
            command=tuple(uploader),
            environment={**aws, "AWS_REGION": settings.region},
            cpus=settings.rule_cpus,
            memory_mb=settings.rule_memory_mb,
            volumes={volume: CONTAINER_TENSORS},
        )
    )
    for rule in spec.rules:
        components.append(
            ComponentSpec(
                role=rule_role(rule.configuration_name),
                image=settings.service_image,
                command=("python", "-m", "trainguard.services.rule_runner"),
                environment={**aws, **_rule_environment(spec, rule, settings, base_trial, runner_token, None)},
                cpus=settings.rule_cpus,
                memory_mb=settings.rule_memory_mb,
            )
        )
    return JobLaunch(spec.name, tuple(components))
