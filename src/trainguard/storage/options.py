"""Where and as whom ``s3://`` runs are reached: endpoint, profile, region.

One set of options for every entry point. The ``trainguard`` verbs take ``--endpoint-url``,
``--profile`` (``--aws-profile``) and ``--region`` (:func:`add_storage_arguments`); the hooks and
``create_trial`` take ``endpoint_url``, ``profile`` and ``region``. :func:`resolve_storage_options`
is the one place that turns what was given into what the S3 client gets, in this order:

1. the argument (a flag, a keyword);
2. ``TRAINGUARD_STORAGE_ENDPOINT_URL`` / ``_PROFILE`` / ``_REGION``: what a ``trainguard`` command
   passes to the processes it starts (the training script's hook, the rule runner), so that the
   options of ``trainguard run --endpoint-url ...`` reach them without changing the AWS
   variables the training script itself sees;
3. the variables boto3 reads: ``AWS_ENDPOINT_URL_S3`` then ``AWS_ENDPOINT_URL`` (both ignored
   when ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`` is true), ``AWS_PROFILE`` then
   ``AWS_DEFAULT_PROFILE``, ``AWS_REGION`` then ``AWS_DEFAULT_REGION``;
4. nothing: botocore then reads the AWS config file (the profile's ``endpoint_url``, ``region``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "PROPAGATED_VARIABLES",
    "StorageOptions",
    "add_storage_arguments",
    "resolve_storage_options",
    "storage_options_from_args",
]

# What a trainguard command hands to the processes it starts (see the module docstring).
PROPAGATED_VARIABLES = {
    "endpoint_url": "TRAINGUARD_STORAGE_ENDPOINT_URL",
    "profile": "TRAINGUARD_STORAGE_PROFILE",
    "region": "TRAINGUARD_STORAGE_REGION",
}
_AWS_VARIABLES = {
    "endpoint_url": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "profile": ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
}


@dataclasses.dataclass(frozen=True)
class StorageOptions:
    """Resolved options for ``s3://`` stores; ``None`` leaves the choice to botocore."""

    endpoint_url: str | None = None
    profile: str | None = None
    region: str | None = None

    def store_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`trainguard.storage.open_store` (``S3Store``)."""
        kwargs = {"endpoint_url": self.endpoint_url, "profile_name": self.profile, "region_name": self.region}
        return {key: value for key, value in kwargs.items() if value is not None}

    def environment(self) -> dict[str, str]:
        """The variables that pass these options to a process this one starts."""
        values = dataclasses.asdict(self)
        return {variable: values[field] for field, variable in PROPAGATED_VARIABLES.items() if values[field]}

    @contextlib.contextmanager
    def exported(self) -> Iterator[StorageOptions]:
        """Put :meth:`environment` into ``os.environ`` for the duration (restored after), so every
        store this process opens and every process it starts uses these options."""
        saved = {variable: os.environ.get(variable) for variable in PROPAGATED_VARIABLES.values()}
        os.environ.update(self.environment())
        try:
            yield self
        finally:
            for variable, value in saved.items():
                if value is None:
                    os.environ.pop(variable, None)
                else:
                    os.environ[variable] = value


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def resolve_storage_options(
    endpoint_url: str | None = None,
    profile: str | None = None,
    region: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> StorageOptions:
    """The options an S3 store uses: the arguments, else the environment (module docstring)."""
    env = os.environ if environ is None else environ
    given = {"endpoint_url": endpoint_url, "profile": profile, "region": region}
    resolved: dict[str, str | None] = {}
    for field, value in given.items():
        if not value:
            names: tuple[str, ...] = (PROPAGATED_VARIABLES[field],)
            if field != "endpoint_url" or not _truthy(env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")):
                names += _AWS_VARIABLES[field]
            value = next((env[name] for name in names if env.get(name)), None)
        resolved[field] = value or None
    return StorageOptions(**resolved)


def add_storage_arguments(parser: argparse.ArgumentParser, *, profile_flag: bool = True) -> None:
    """``--endpoint-url``, ``--profile``/``--aws-profile`` and ``--region`` on one verb.

    ``profile_flag=False`` leaves ``--profile`` out for a verb that uses it otherwise
    (``trainguard run --profile`` records system metrics): ``--aws-profile`` names the profile there.
    """
    group = parser.add_argument_group("storage (s3:// runs; default: the AWS environment variables)")
    group.add_argument(
        "--endpoint-url", metavar="URL",
        help="S3-compatible endpoint (MinIO, Ceph, moto ...); default $AWS_ENDPOINT_URL_S3 or $AWS_ENDPOINT_URL",
    )  # fmt: skip
    flags = ("--profile", "--aws-profile") if profile_flag else ("--aws-profile",)
    group.add_argument(*flags, dest="aws_profile", metavar="NAME", help="AWS profile (default $AWS_PROFILE)")
    group.add_argument("--region", metavar="REGION", help="AWS region (default $AWS_REGION or $AWS_DEFAULT_REGION)")


def storage_options_from_args(args: argparse.Namespace) -> StorageOptions:
    """The options of :func:`add_storage_arguments`, resolved against the environment."""
    return resolve_storage_options(
        getattr(args, "endpoint_url", None), getattr(args, "aws_profile", None), getattr(args, "region", None)
    )
