"""``InputDataConfig`` channels from S3 into ``input/data/<channel>`` (File mode).

Prefix channels follow the SageMaker SDK's own local mode: an ``S3Uri`` naming one object gives
that object; otherwise every object under the key prefix lands at its key relative to the prefix.
Manifest channels list a ``{"prefix": ...}`` and keys relative to it. ``ShardedByS3Key`` gives
host *i* of *n* every *n*-th key of the sorted list, starting at *i*. A key that would land
outside the channel directory (``..``) is refused, never written.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path, PurePosixPath
from typing import Any

from trainguard.services.errors import ServiceError
from trainguard.services.sagemaker_container.contract import Channel, ContractError

__all__ = ["ChannelError", "download_channel", "split_s3_uri"]

logger = logging.getLogger("trainguard.sagemaker_container")


class ChannelError(ServiceError, RuntimeError):
    """A channel's data could not be fetched; the message names the channel and the object."""


def split_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ContractError(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[5:].partition("/")
    if not bucket:
        raise ContractError(f"{uri!r} names no bucket")
    return bucket, key


def _safe_target(root: Path, relative: str) -> Path:
    parts = PurePosixPath(relative).parts
    if not parts or any(part in ("..", "") for part in parts) or PurePosixPath(relative).is_absolute():
        raise ChannelError(f"object key {relative!r} would land outside the channel directory")
    return root.joinpath(*parts)


def _list_keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(item["Key"] for item in page.get("Contents") or () if not item["Key"].endswith("/"))
    return sorted(keys)


def _prefix_objects(s3: Any, bucket: str, prefix: str) -> list[tuple[str, str, str]]:
    """(bucket, key, path relative to the channel) for a prefix channel."""
    keys = _list_keys(s3, bucket, prefix)
    if prefix and not prefix.endswith("/") and prefix in keys:
        return [(bucket, prefix, PurePosixPath(prefix).name)]
    return [(bucket, key, key[len(prefix) :].lstrip("/")) for key in keys]


def _manifest_objects(s3: Any, bucket: str, key: str) -> list[tuple[str, str, str]]:
    try:
        manifest = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        base = manifest[0]["prefix"]
        relative_keys = [str(item) for item in manifest[1:]]
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise ChannelError(f"manifest s3://{bucket}/{key} is not [{{'prefix': ...}}, key, ...]: {error}") from None
    base_bucket, base_key = split_s3_uri(base)
    return [(base_bucket, base_key + relative, relative) for relative in relative_keys]


def download_channel(s3: Any, channel: Channel, target: Path, *, host_index: int = 0, host_count: int = 1) -> int:
    """Fetch ``channel`` into ``target``; returns the number of objects written."""
    bucket, key = split_s3_uri(channel.s3_uri)
    if channel.data_type == "S3Prefix":
        objects = _prefix_objects(s3, bucket, key)
    else:
        objects = _manifest_objects(s3, bucket, key)
    if channel.distribution == "ShardedByS3Key" and host_count > 1:
        objects = objects[host_index::host_count]
    target.mkdir(parents=True, exist_ok=True)
    for object_bucket, object_key, relative in objects:
        destination = _safe_target(target, relative)
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            s3.download_file(object_bucket, object_key, str(destination))
        except Exception as error:  # botocore's errors have no common base worth importing here
            raise ChannelError(f"channel {channel.name}: s3://{object_bucket}/{object_key}: {error}") from error
    logger.info("channel %s: %d object(s) from %s", channel.name, len(objects), channel.s3_uri)
    return len(objects)
