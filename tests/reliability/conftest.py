"""The reliability suite: real faults (kill -9, an S3 endpoint restarted empty, an API restarted
mid-run, a job that captures nothing, a training disk that fills up) against the real uploader,
launcher, API and rule runners."""

from tests.s3_server import s3_endpoint  # noqa: F401 - pytest fixture by name (the API fixtures use it)
from tests.services.conftest import api, api_factory  # noqa: F401 - pytest fixtures by name
