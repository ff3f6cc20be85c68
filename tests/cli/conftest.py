"""Fixtures of the CLI tests: the real moto S3 server (tests/s3_server.py)."""

from tests.s3_server import s3_bucket, s3_endpoint  # noqa: F401  (fixtures)
