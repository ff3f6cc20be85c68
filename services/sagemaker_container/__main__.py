"""Run one SageMaker training job job-side: ``python -m trainguard.services.sagemaker_container``.

Reads the contract from ``$TRAINGUARD_SM_CONTRACT`` (JSON, see contract.py), lays out the
``/opt/ml`` tree under ``$SAGEMAKER_BASE_DIR`` (default ``/opt/ml``), fetches the channels, runs
the training and uploads its outputs; exits with the training's exit code. S3 is reached at
``$S3_ENDPOINT_URL`` when set.

The training runs as a child process, so the capture hook (installed by ``trainguard run`` or the
training image's entrypoint through ``PYTHONPATH``) sees the user's process as it would on
SageMaker. SIGTERM (StopTrainingJob) is passed on to the child; its outputs are uploaded as
SageMaker does for a stopped job.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path

from trainguard.services.sagemaker_container.channels import ChannelError, download_channel
from trainguard.services.sagemaker_container.contract import (
    CONTRACT_ENV,
    FAILURE_REASON_MARKER,
    ContractError,
    JobContract,
    MlPaths,
)
from trainguard.services.sagemaker_container.outputs import read_failure, upload_outputs

logger = logging.getLogger("trainguard.sagemaker_container")

# The toolkit's own entry point, as SageMaker's framework containers call it.
_TOOLKIT_TRAIN = "from sagemaker_training import trainer; trainer.train()"


def _s3_client(contract: JobContract):  # type: ignore[no-untyped-def]
    import boto3

    return boto3.client("s3", endpoint_url=os.environ.get("S3_ENDPOINT_URL") or None, region_name=contract.region)


def _fail(paths: MlPaths, reason: str) -> None:
    paths.failure.parent.mkdir(parents=True, exist_ok=True)
    paths.failure.write_text(reason)
    # One machine-readable line in the job's log: how the service, which sees only the log and
    # the exit code on every launcher, learns the FailureReason (see FAILURE_REASON_MARKER).
    print(FAILURE_REASON_MARKER + json.dumps(reason), file=sys.stderr, flush=True)


def _training_command(contract: JobContract, paths: MlPaths) -> list[str] | None:
    if contract.command:
        return list(contract.command)
    if contract.framework_mode:
        if importlib.util.find_spec("sagemaker_training") is None:
            _fail(
                paths,
                "ClientError: this training environment lacks the sagemaker-training toolkit that runs "
                "sagemaker_program jobs: pip install 'trainguard[sagemaker]' (or sagemaker-training) there",
            )
            return None
        return [sys.executable, "-c", _TOOLKIT_TRAIN]
    _fail(
        paths,
        "ClientError: nothing to run: give AlgorithmSpecification.ContainerEntrypoint, or "
        "sagemaker_program and sagemaker_submit_directory in HyperParameters (what the SageMaker SDK sends)",
    )
    return None


def _last_error_line(lines: list[str]) -> str:
    """The exception line ("ValueError: ...") of the last Python traceback in ``lines``, or ''."""
    starts = [index for index, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if not starts:
        return ""
    for line in lines[starts[-1] + 1 :]:
        if line.strip() and not line[:1].isspace():
            return line.strip()
    return ""


def _run(command: list[str], environment: dict[str, str], cwd: Path, stderr_tail: deque[str]) -> int:
    """Run ``command``; its stderr is passed through and its last lines kept in ``stderr_tail``."""
    child = subprocess.Popen(
        command, env=environment, cwd=str(cwd), stderr=subprocess.PIPE, text=True, errors="replace"
    )

    def relay() -> None:
        assert child.stderr is not None
        for line in child.stderr:
            sys.stderr.write(line)
            stderr_tail.append(line)
        sys.stderr.flush()

    relay_thread = threading.Thread(target=relay, name="stderr-relay", daemon=True)
    relay_thread.start()

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = child.wait()
        relay_thread.join(timeout=10)
        return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _empty_code_dir(paths: MlPaths) -> None:
    """Make room for the SDK's source: the toolkit unpacks ``sourcedir.tar.gz`` only into an empty
    ``/opt/ml/code`` and otherwise runs whatever is there (an image's own files, e.g. trainguard's
    demo scripts). The job's container or directory is its own, so its contents can go."""
    if not paths.code.is_dir():
        return
    for entry in paths.code.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def run_job(contract: JobContract, paths: MlPaths) -> int:
    """Every step of the job; the training's exit code (1 when it could not start)."""
    hook_json = os.environ.get("TRAINGUARD_HOOK_CONFIG_JSON")
    try:
        hook_document = json.loads(hook_json) if hook_json else None
    except ValueError:
        hook_document = None  # the capture side reports a bad config itself
    if contract.framework_mode:
        _empty_code_dir(paths)
    contract.write_config(paths, hook_document)
    s3 = _s3_client(contract)
    host_index = contract.hosts.index(contract.current_host) if contract.current_host in contract.hosts else 0
    try:
        for channel in contract.channels:
            download_channel(s3, channel, paths.channel(channel.name),
                             host_index=host_index, host_count=contract.instance_count)  # fmt: skip
    except (ChannelError, ContractError) as error:
        _fail(paths, f"ClientError: {error}")
        return 1
    except Exception as error:  # noqa: BLE001 - S3 unreachable while listing, bad credentials...: said, not a traceback
        _fail(paths, f"ClientError: could not fetch the input channels: {type(error).__name__}: {error}")
        return 1
    command = _training_command(contract, paths)
    if command is None:
        return 1
    environment = {**os.environ, **contract.environment(paths)}
    if contract.instance_count == 1:
        # The toolkit waits (up to 15 min) until every host name resolves, which only a
        # multi-host cluster's DNS provides; one host needs no peers (its Studio-local switch).
        environment.setdefault("SM_STUDIO_LOCAL_MODE", "true")
    stderr_tail: deque[str] = deque(maxlen=200)
    code = _run(command, environment, paths.code if contract.framework_mode else Path.cwd(), stderr_tail)
    if code != 0:
        # SageMaker's FailureReason names the user's error; the toolkit's own failure file often
        # carries only the exit code ('ErrorMessage ""'), so the last traceback line is added.
        error_line = _last_error_line(list(stderr_tail))
        written = read_failure(paths)
        if written is None:
            _fail(
                paths, f"AlgorithmError: training exited with code {code}" + (f": {error_line}" if error_line else "")
            )
        elif error_line and error_line not in written:
            _fail(paths, f"AlgorithmError: {error_line}\n{written}")
    if contract.hosts and contract.current_host != contract.hosts[0]:
        # A multi-instance job: the first host uploads the model and output (scripts save on
        # rank 0, as SageMaker's examples do); another host's upload would overwrite it.
        return code
    with tempfile.TemporaryDirectory() as scratch:
        try:
            uploaded = upload_outputs(s3, contract, paths, Path(scratch))
        except Exception as error:  # an output that cannot be uploaded fails the job loudly
            _fail(paths, f"ClientError: could not upload the job's outputs: {error}")
            return code or 1
    for label, uri in uploaded.items():
        logger.info("uploaded %s to %s", label, uri)
    return code


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="trainguard-sagemaker: %(message)s")
    base = Path(os.environ.get("SAGEMAKER_BASE_DIR") or "/opt/ml")
    paths = MlPaths(base)
    raw = os.environ.get(CONTRACT_ENV)
    if not raw:
        print(f"trainguard-sagemaker: ${CONTRACT_ENV} is not set: nothing to run", file=sys.stderr)
        return 2
    try:
        contract = JobContract.from_json(raw)
    except (ValueError, TypeError) as error:
        _fail(paths, f"ClientError: the job contract is unreadable: {error}")
        return 2
    return run_job(contract, paths)


if __name__ == "__main__":
    sys.exit(main())
