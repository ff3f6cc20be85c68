"""After training: ``model/`` and ``output/data/`` packed and uploaded; ``output/failure`` read.

SageMaker uploads ``model.tar.gz`` (DescribeTrainingJob's ``ModelArtifacts.S3ModelArtifacts``)
and ``output.tar.gz`` to ``<S3OutputPath>/<job>/output/``; the failure file's text becomes the
job's ``FailureReason``. The archive members are relative to the directory, as SageMaker packs
them (``model.pth``, not ``opt/ml/model/model.pth``), so ``tarfile.extractall`` of the archive
gives back the directory's content.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

from trainguard.services.sagemaker_container.channels import split_s3_uri
from trainguard.services.sagemaker_container.contract import JobContract, MlPaths

__all__ = ["FAILURE_REASON_LIMIT", "pack_directory", "read_failure", "upload_outputs"]

# DescribeTrainingJob's FailureReason is at most 1024 characters.
FAILURE_REASON_LIMIT = 1024


def pack_directory(directory: Path, archive: Path) -> None:
    """``directory``'s content as a gzip tar, members relative to it (symlinks kept as links)."""
    with tarfile.open(archive, "w:gz") as tar:
        for entry in sorted(directory.rglob("*")):
            tar.add(entry, arcname=str(entry.relative_to(directory)), recursive=False)


def read_failure(paths: MlPaths) -> str | None:
    """The text the job wrote to ``output/failure`` (trimmed to SageMaker's limit), or None."""
    try:
        text = paths.failure.read_text(errors="replace").strip()
    except OSError:
        return None
    return text[:FAILURE_REASON_LIMIT] or None


def upload_outputs(s3: Any, contract: JobContract, paths: MlPaths, scratch: Path) -> dict[str, str]:
    """Pack and upload ``model.tar.gz`` (always, even empty, as SageMaker does) and ``output.tar.gz``.

    Returns {"model": uri, "output": uri}; nothing when the job has no output path.
    """
    if not contract.output_path:
        return {}
    model_uri = contract.model_artifact_uri()
    assert model_uri is not None
    output_uri = model_uri.rsplit("/", 1)[0] + "/output.tar.gz"
    uploaded: dict[str, str] = {}
    for label, directory, uri in (("model", paths.model, model_uri), ("output", paths.output_data, output_uri)):
        if label == "output" and not any(directory.glob("*")):
            continue
        archive = scratch / f"{label}.tar.gz"
        directory.mkdir(parents=True, exist_ok=True)
        pack_directory(directory, archive)
        bucket, key = split_s3_uri(uri)
        s3.upload_file(str(archive), bucket, key)
        uploaded[label] = uri
    return uploaded
