"""A SageMaker training job's contract with its container, and the ``/opt/ml`` files it becomes.

The API derives a :class:`JobContract` from ``CreateTrainingJob`` (:func:`contract_from_request`)
and hands it to the training component as JSON (``TRAINGUARD_SM_CONTRACT``); the job side
(:mod:`trainguard.services.sagemaker_container.__main__`) writes the files below under the base directory
(``/opt/ml`` in a container, ``<job dir>/opt/ml`` for a local process, as the ``sagemaker-training``
toolkit's ``SAGEMAKER_BASE_DIR`` allows):

    input/config/hyperparameters.json   the HyperParameters map as sent (JSON-encoded strings)
    input/config/resourceconfig.json    current_host, hosts, network_interface_name
    input/config/inputdataconfig.json   per channel: TrainingInputMode, S3DistributionType, ...
    input/config/debughookconfig.json   DebugHookConfig (when given)
    input/config/profilerconfig.json    ProfilerConfig (when given)
    input/data/<channel>/               the channel's objects (see channels.py)
    model/  output/data/  output/failure  checkpoints/  code/
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainguard.services.errors import ServiceError

__all__ = [
    "CONTRACT_ENV",
    "FAILURE_REASON_MARKER",
    "Channel",
    "ContractError",
    "JobContract",
    "MlPaths",
    "contract_from_request",
    "failure_reason_from_log",
]

# The environment variable that carries the contract's JSON to the job side.
CONTRACT_ENV = "TRAINGUARD_SM_CONTRACT"
# The job-side runner's log line that carries /opt/ml/output/failure to the service.
FAILURE_REASON_MARKER = "trainguard-sagemaker: FailureReason="


def failure_reason_from_log(log: str) -> str | None:
    """The last FailureReason the job-side runner logged, or None."""
    for line in reversed(log.splitlines()):
        if line.startswith(FAILURE_REASON_MARKER):
            try:
                reason = json.loads(line[len(FAILURE_REASON_MARKER) :])
            except ValueError:
                return None
            return reason if isinstance(reason, str) else None
    return None


_CHANNEL_NAME = re.compile(r"^[A-Za-z0-9\.\-_]{1,64}$")
# AugmentedManifestFile (JSON lines of records, streamed in Pipe mode) is not served: refused.
_DATA_TYPES = {"S3Prefix", "ManifestFile"}
_DISTRIBUTIONS = {"FullyReplicated", "ShardedByS3Key"}
_INPUT_MODES = {"File", "FastFile", "Pipe"}


class ContractError(ServiceError, ValueError):
    """A CreateTrainingJob member the contract cannot use; the message names the member."""


@dataclass(frozen=True)
class Channel:
    """One ``InputDataConfig`` entry with an S3 data source."""

    name: str
    s3_uri: str
    data_type: str = "S3Prefix"
    distribution: str = "FullyReplicated"
    input_mode: str = "File"
    content_type: str | None = None
    compression: str = "None"
    record_wrapper: str = "None"


@dataclass(frozen=True)
class MlPaths:
    """The directories of one job's ``/opt/ml`` tree."""

    base: Path

    @property
    def config(self) -> Path:
        return self.base / "input" / "config"

    @property
    def data(self) -> Path:
        return self.base / "input" / "data"

    @property
    def model(self) -> Path:
        return self.base / "model"

    @property
    def output(self) -> Path:
        return self.base / "output"

    @property
    def output_data(self) -> Path:
        return self.base / "output" / "data"

    @property
    def failure(self) -> Path:
        return self.base / "output" / "failure"

    @property
    def code(self) -> Path:
        return self.base / "code"

    @property
    def checkpoints(self) -> Path:
        return self.base / "checkpoints"

    def channel(self, name: str) -> Path:
        return self.data / name


# GPUs of the SageMaker training instance types that have them (AWS's instance-type table): what
# the Ray launcher asks for per instance. A type not listed has none.
GPUS_BY_INSTANCE_TYPE = {
    "ml.p2.xlarge": 1, "ml.p2.8xlarge": 8, "ml.p2.16xlarge": 16,
    "ml.p3.2xlarge": 1, "ml.p3.8xlarge": 4, "ml.p3.16xlarge": 8, "ml.p3dn.24xlarge": 8,
    "ml.p4d.24xlarge": 8, "ml.p4de.24xlarge": 8, "ml.p5.48xlarge": 8,
    "ml.g4dn.xlarge": 1, "ml.g4dn.2xlarge": 1, "ml.g4dn.4xlarge": 1, "ml.g4dn.8xlarge": 1,
    "ml.g4dn.12xlarge": 4, "ml.g4dn.16xlarge": 1,
    "ml.g5.xlarge": 1, "ml.g5.2xlarge": 1, "ml.g5.4xlarge": 1, "ml.g5.8xlarge": 1, "ml.g5.16xlarge": 1,
    "ml.g5.12xlarge": 4, "ml.g5.24xlarge": 4, "ml.g5.48xlarge": 8,
}  # fmt: skip


@dataclass(frozen=True)
class JobContract:
    """What one training job's container is promised. See the module docstring."""

    job_name: str
    hyperparameters: Mapping[str, str] = field(default_factory=dict)
    channels: tuple[Channel, ...] = ()
    output_path: str | None = None
    instance_count: int = 1
    instance_type: str = ""
    current_host: str = "algo-1"
    region: str = "us-east-1"
    command: tuple[str, ...] = ()
    hook_config: Mapping[str, Any] | None = None
    profiler_config: Mapping[str, Any] | None = None

    # -- facts ---------------------------------------------------------------------------------
    @property
    def hosts(self) -> list[str]:
        return [f"algo-{index + 1}" for index in range(self.instance_count)]

    @property
    def framework_mode(self) -> bool:
        """SageMaker's framework path: no entry point given, the SDK's program and source instead."""
        return not self.command and "sagemaker_program" in self.hyperparameters

    def decoded_hyperparameter(self, key: str) -> Any:
        """A hyperparameter as the toolkit sees it: JSON-decoded where it is JSON, else the string."""
        raw = self.hyperparameters[key]
        try:
            return json.loads(raw)
        except (TypeError, ValueError):
            return raw

    def user_hyperparameters(self) -> dict[str, Any]:
        """The user's hyperparameters (the SDK's ``sagemaker_*`` ones left out), JSON-decoded."""
        return {
            key: self.decoded_hyperparameter(key) for key in self.hyperparameters if not key.startswith("sagemaker_")
        }

    def model_artifact_uri(self) -> str | None:
        """``<S3OutputPath>/<job>/output/model.tar.gz`` (DescribeTrainingJob's ModelArtifacts)."""
        if not self.output_path:
            return None
        return f"{self.output_path.rstrip('/')}/{self.job_name}/output/model.tar.gz"

    # -- (de)serialisation ---------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> JobContract:
        data = json.loads(text)
        data["channels"] = tuple(Channel(**item) for item in data.get("channels") or ())
        data["command"] = tuple(data.get("command") or ())
        return cls(**data)

    # -- the /opt/ml tree ----------------------------------------------------------------------
    def write_config(self, paths: MlPaths, hook_document: Mapping[str, Any] | None = None) -> None:
        """Create the tree and the ``input/config`` files (not the channel data).

        ``hook_document`` is the DebugHookConfig as the service resolved it (its ``LocalPath`` is
        where the capture must go); without it the request's, written to SageMaker's default path.
        """
        for directory in (paths.config, paths.data, paths.model, paths.output_data, paths.code, paths.checkpoints):
            directory.mkdir(parents=True, exist_ok=True)
        for channel in self.channels:
            paths.channel(channel.name).mkdir(parents=True, exist_ok=True)
        _write_json(paths.config / "hyperparameters.json", dict(self.hyperparameters))
        _write_json(
            paths.config / "resourceconfig.json",
            {"current_host": self.current_host, "hosts": self.hosts, "network_interface_name": "eth0"},
        )
        channels: dict[str, dict[str, str]] = {}
        for channel in self.channels:
            entry = {
                "TrainingInputMode": channel.input_mode,
                "S3DistributionType": channel.distribution,
                "RecordWrapperType": channel.record_wrapper,
            }
            if channel.content_type:
                entry["ContentType"] = channel.content_type
            channels[channel.name] = entry
        _write_json(paths.config / "inputdataconfig.json", channels)
        if hook_document is None and self.hook_config is not None:
            hook_document = {**self.hook_config, "LocalPath": str(paths.output / "tensors")}
        if hook_document is not None:
            _write_json(paths.config / "debughookconfig.json", dict(hook_document))
        if self.profiler_config is not None:
            _write_json(paths.config / "profilerconfig.json", dict(self.profiler_config))

    def environment(self, paths: MlPaths) -> dict[str, str]:
        """The ``SM_*`` environment the toolkit exports, for jobs that run their own entry point.

        The framework path gets the same variables from the toolkit itself.
        """
        hyperparameters = self.user_hyperparameters()
        channel_dirs = {channel.name: str(paths.channel(channel.name)) for channel in self.channels}
        environment = {
            "SM_MODEL_DIR": str(paths.model),
            "SM_OUTPUT_DIR": str(paths.output),
            "SM_OUTPUT_DATA_DIR": str(paths.output_data),
            "SM_INPUT_DIR": str(paths.base / "input"),
            "SM_INPUT_CONFIG_DIR": str(paths.config),
            "SM_CHANNELS": json.dumps(sorted(channel_dirs)),
            "SM_HPS": json.dumps(hyperparameters),
            "SM_CURRENT_HOST": self.current_host,
            "SM_HOSTS": json.dumps(self.hosts),
            "SM_NUM_CPUS": str(os.cpu_count() or 1),
            "SM_NUM_GPUS": str(_gpu_count()),
            "SM_USER_ARGS": json.dumps(_command_line_arguments(hyperparameters)),
            "SM_CHECKPOINT_DIR": str(paths.checkpoints),
            "SAGEMAKER_BASE_DIR": str(paths.base),
            "TRAINING_JOB_NAME": self.job_name,
        }
        for name, directory in channel_dirs.items():
            environment[f"SM_CHANNEL_{_env_name(name)}"] = directory
        for key, value in hyperparameters.items():
            environment[f"SM_HP_{_env_name(key)}"] = value if isinstance(value, str) else json.dumps(value)
        if self.hook_config is not None:
            environment["SMDEBUG_CONFIG_FILE_PATH"] = str(paths.config / "debughookconfig.json")
        return environment


def _env_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def _command_line_arguments(hyperparameters: Mapping[str, Any]) -> list[str]:
    """``--key value`` pairs, as the toolkit passes hyperparameters to an entry point."""
    arguments: list[str] = []
    for key, value in sorted(hyperparameters.items()):
        arguments += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    return arguments


def _gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([item for item in visible.split(",") if item.strip()])
    return (
        len([entry for entry in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", entry)])
        if os.path.isdir("/dev")
        else 0
    )


def _write_json(path: Path, document: Any) -> None:
    path.write_text(json.dumps(document, indent=2))


# -- from CreateTrainingJob -------------------------------------------------------------------


def _member(condition: bool, member: str, problem: str) -> None:
    if not condition:
        raise ContractError(f"{member}: {problem}")


def _channels(request: Mapping[str, Any]) -> tuple[Channel, ...]:
    raw = request.get("InputDataConfig") or []
    _member(isinstance(raw, list), "InputDataConfig", "must be a list of channels")
    channels: list[Channel] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        label = f"InputDataConfig[{index}]"
        _member(isinstance(item, dict), label, "must be an object")
        name = item.get("ChannelName")
        _member(isinstance(name, str) and bool(_CHANNEL_NAME.match(name)), f"{label}.ChannelName",
                "must be 1-64 letters, digits, '.', '-' or '_'")  # fmt: skip
        _member(name not in seen, f"{label}.ChannelName", f"channel {name!r} is given twice")
        seen.add(name)
        source = (
            (item.get("DataSource") or {}).get("S3DataSource") if isinstance(item.get("DataSource"), dict) else None
        )
        if not isinstance(source, dict):
            raise ContractError(f"{label}.DataSource.S3DataSource: trainguard reads channels from S3 only "
                                "(FileSystemDataSource is not supported)")  # fmt: skip
        uri = source.get("S3Uri")
        if not (isinstance(uri, str) and uri.startswith("s3://") and len(uri) > 5):
            raise ContractError(f"{label}.DataSource.S3DataSource.S3Uri: must be an s3:// URI")
        data_type = source.get("S3DataType", "S3Prefix")
        _member(data_type in _DATA_TYPES, f"{label}.DataSource.S3DataSource.S3DataType",
                f"must be one of {sorted(_DATA_TYPES)} (trainguard does not serve AugmentedManifestFile)")  # fmt: skip
        distribution = source.get("S3DataDistributionType", "FullyReplicated")
        _member(distribution in _DISTRIBUTIONS, f"{label}.DataSource.S3DataSource.S3DataDistributionType",
                f"must be one of {sorted(_DISTRIBUTIONS)}")  # fmt: skip
        mode = item.get("InputMode") or request.get("AlgorithmSpecification", {}).get("TrainingInputMode") or "File"
        _member(mode in _INPUT_MODES, f"{label}.InputMode", f"must be one of {sorted(_INPUT_MODES)}")
        content_type = item.get("ContentType")
        _member(content_type is None or isinstance(content_type, str), f"{label}.ContentType", "must be a string")
        compression = item.get("CompressionType", "None")
        _member(compression in ("None", "Gzip"), f"{label}.CompressionType", "must be None or Gzip")
        wrapper = item.get("RecordWrapperType", "None")
        _member(wrapper in ("None", "RecordIO"), f"{label}.RecordWrapperType", "must be None or RecordIO")
        channels.append(Channel(name, uri, data_type, distribution, mode, content_type, compression, wrapper))
    return tuple(channels)


def contract_from_request(request: Mapping[str, Any], *, region: str = "us-east-1") -> JobContract:
    """The contract of a ``CreateTrainingJob`` request; ContractError names a bad member."""
    name = request.get("TrainingJobName")
    if not isinstance(name, str) or not name:
        raise ContractError("TrainingJobName: is required")
    hyperparameters = request.get("HyperParameters") or {}
    _member(isinstance(hyperparameters, dict), "HyperParameters", "must be a map of strings")
    for key, value in hyperparameters.items():
        _member(isinstance(value, str), f"HyperParameters.{key}", "must be a string")
    algorithm = request.get("AlgorithmSpecification") or {}
    _member(isinstance(algorithm, dict), "AlgorithmSpecification", "must be an object")
    command = [*(algorithm.get("ContainerEntrypoint") or []), *(algorithm.get("ContainerArguments") or [])]
    _member(all(isinstance(part, str) for part in command), "AlgorithmSpecification.ContainerEntrypoint",
            "must be a list of strings")  # fmt: skip
    output = request.get("OutputDataConfig") or {}
    _member(isinstance(output, dict), "OutputDataConfig", "must be an object")
    output_path = output.get("S3OutputPath")
    _member(output_path is None or (isinstance(output_path, str) and output_path.startswith("s3://")),
            "OutputDataConfig.S3OutputPath", "must be an s3:// URI")  # fmt: skip
    resources = request.get("ResourceConfig") or {}
    _member(isinstance(resources, dict), "ResourceConfig", "must be an object")
    count = resources.get("InstanceCount", 1)
    _member(isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= 64,
            "ResourceConfig.InstanceCount", "must be an integer from 1 to 64")  # fmt: skip
    if "sagemaker_program" in hyperparameters and not command:
        _member("sagemaker_submit_directory" in hyperparameters, "HyperParameters.sagemaker_submit_directory",
                "is required with sagemaker_program (the SDK uploads the source there)")  # fmt: skip
    return JobContract(
        job_name=name,
        hyperparameters=dict(hyperparameters),
        channels=_channels(request),
        output_path=output_path,
        instance_count=count,
        instance_type=str(resources.get("InstanceType") or ""),
        region=region,
        command=tuple(command),
        hook_config=request.get("DebugHookConfig"),
        profiler_config=request.get("ProfilerConfig"),
    )
