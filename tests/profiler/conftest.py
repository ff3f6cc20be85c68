"""Fixtures for the profiler tests: a real S3 endpoint (moto server subprocess) when asked for."""

from tests.s3_server import s3_bucket, s3_client, s3_endpoint  # noqa: F401  (fixtures, found by name)
