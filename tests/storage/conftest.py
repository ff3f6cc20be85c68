"""Fixtures for the storage tests: one ``store`` fixture over every Store implementation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.s3_server import s3_bucket, s3_client, s3_endpoint  # noqa: F401  (fixtures, found by name)
from trainguard.storage import LocalStore, MemoryStore, Store
from trainguard.storage.cache import CachingStore
from trainguard.storage.s3 import MIN_PART_SIZE, S3Store

# Objects under these keys sit beside the prefixed store's prefix, or share its first characters,
# so a store that leaks out of its prefix shows them in its listings.
DECOY_KEYS = ("runs/job-10/index/000000000/000000000001_worker_0.json", "runs/job-1.json", "runs/job-0/x", "zzz")
S3_PREFIX = "runs/job-1"


def make_s3_store(endpoint: str, bucket: str, prefix: str = "") -> S3Store:
    # The smallest part size S3 allows, so the multipart tests upload megabytes, not 64 MiB.
    return S3Store(bucket, prefix, endpoint_url=endpoint, multipart_threshold=MIN_PART_SIZE)


@pytest.fixture(params=["local", "memory", "s3", "s3-prefixed", "cached-s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    kind = request.param
    if kind == "local":
        return LocalStore(tmp_path / "run")
    if kind == "memory":
        return MemoryStore()
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    if kind == "s3-prefixed":
        client = s3_client(endpoint)
        for key in DECOY_KEYS:
            client.put_object(Bucket=bucket, Key=key, Body=b"decoy")
        return make_s3_store(endpoint, bucket, S3_PREFIX)
    s3 = make_s3_store(endpoint, bucket)
    return CachingStore(s3, tmp_path / "cache") if kind == "cached-s3" else s3
