"""A run under ``s3://bucket/prefix``, on AWS or any S3-compatible endpoint (MinIO, Ceph, R2, ...)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from trainguard.errors import ConfigError, MissingDependencyError, ObjectNotFound, StorageError
from trainguard.storage.base import Buffer

__all__ = ["MIN_PART_SIZE", "MULTIPART_THRESHOLD", "S3Store"]

logger = logging.getLogger("trainguard")

# Objects up to this size go up in one PUT; larger ones (activations) as a multipart upload of
# parts this size, streamed out while being written so memory holds one part, not the object.
MULTIPART_THRESHOLD = 64 << 20
# S3 rejects multipart parts smaller than this (except the last), so refuse it up front.
MIN_PART_SIZE = 5 << 20
DEFAULT_MAX_ATTEMPTS = 5
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0

# Error codes S3 (and its imitations) use for "the caller's credentials were rejected".
_BAD_CREDENTIAL_CODES = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "TokenRefreshRequired"}
)


def _nbytes(part: Buffer) -> int:
    return part.nbytes if isinstance(part, memoryview) else len(part)


class _S3Writer:
    """Buffers in memory and uploads on commit: one PUT, or a multipart upload for large objects.

    Either way the key appears only at commit: S3 shows neither a PUT in flight nor an
    uncompleted multipart upload.
    """

    def __init__(self, store: S3Store, key: str) -> None:
        self._store = store
        self._key = key
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self._done = False

    def write(self, data: Buffer) -> None:
        if self._done:
            raise StorageError(f"{self._store.url_of(self._key)}: write after commit or abort")
        self._buffer += data
        part_size = self._store.multipart_threshold
        # Strictly greater: an object of exactly one part's size still goes up in a single PUT.
        while len(self._buffer) > part_size:
            self._upload_part(bytes(self._buffer[:part_size]))
            del self._buffer[:part_size]

    def commit(self) -> None:
        if self._done:
            raise StorageError(f"{self._store.url_of(self._key)}: commit after commit or abort")
        self._done = True
        store = self._store
        try:
            if self._upload_id is None:
                store._client.put_object(Bucket=store.bucket, Key=store.full_key(self._key), Body=bytes(self._buffer))
            else:
                # The remainder is never empty: a part is only cut while more data follows it.
                self._upload_part(bytes(self._buffer))
                store._client.complete_multipart_upload(
                    Bucket=store.bucket,
                    Key=store.full_key(self._key),
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": self._parts},
                )
        except store._botocore_errors as error:
            self._abort_upload()
            raise store._error(error, "write", self._key) from error
        finally:
            self._buffer = bytearray()

    def abort(self) -> None:
        self._done = True
        self._buffer = bytearray()
        self._abort_upload()

    def _upload_part(self, data: bytes) -> None:
        store = self._store
        try:
            if self._upload_id is None:
                response = store._client.create_multipart_upload(Bucket=store.bucket, Key=store.full_key(self._key))
                self._upload_id = response["UploadId"]
            number = len(self._parts) + 1
            response = store._client.upload_part(
                Bucket=store.bucket,
                Key=store.full_key(self._key),
                UploadId=self._upload_id,
                PartNumber=number,
                Body=data,
            )
        except store._botocore_errors as error:
            self._done = True
            self._abort_upload()
            raise store._error(error, "write", self._key) from error
        self._parts.append({"PartNumber": number, "ETag": response["ETag"]})

    def _abort_upload(self) -> None:
        # Best effort and never raising: this runs on error paths, where a second exception would
        # hide the first. An upload left behind is invisible and only costs storage until a
        # bucket lifecycle rule (AbortIncompleteMultipartUpload) removes it.
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is None:
            return
        store = self._store
        try:
            store._client.abort_multipart_upload(Bucket=store.bucket, Key=store.full_key(self._key), UploadId=upload_id)
        except store._botocore_errors as error:
            logger.warning("could not abort the multipart upload of %s: %s", store.url_of(self._key), error)


class S3Store:
    """Objects under ``prefix`` in an S3 bucket.

    Args:
        bucket: the bucket; it must exist.
        prefix: the run's folder in the bucket, without a leading or trailing ``/``; may be empty.
        endpoint_url: an S3-compatible endpoint such as ``http://minio:9000``.
        profile_name: the AWS profile whose credentials and settings to use.
        region_name: the region.
            The three default as :func:`trainguard.storage.options.resolve_storage_options`
            says (the ``trainguard`` command's options, ``AWS_ENDPOINT_URL_S3``, ``AWS_PROFILE``,
            ``AWS_REGION`` ..., then the AWS config file).
        client: a ready boto3 S3 client to use instead of building one (its own retry and timeout
            settings then apply).
        multipart_threshold: objects larger than this are uploaded in parts of this size.
        max_attempts: attempts per request including the first; default ``AWS_MAX_ATTEMPTS`` when
            set, else 5.

    Raises:
        MissingDependencyError: boto3 is not installed.
        ConfigError: the bucket, endpoint or part size is invalid.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        client: Any = None,
        multipart_threshold: int = MULTIPART_THRESHOLD,
        profile_name: str | None = None,
        max_attempts: int | None = None,
    ) -> None:
        try:
            import boto3  # noqa: F401 - the dependency users install; its botocore does the work
            import botocore.config
            import botocore.exceptions
            import botocore.session
        except ImportError:
            raise MissingDependencyError("boto3", "s3", "s3:// storage") from None
        if not bucket or "/" in bucket:
            raise ConfigError(f"invalid S3 bucket name {bucket!r}: use s3://bucket/prefix")
        if max_attempts is not None and max_attempts < 1:
            raise ConfigError(f"max_attempts={max_attempts} must be at least 1")
        if multipart_threshold < MIN_PART_SIZE:
            raise ConfigError(
                f"multipart_threshold={multipart_threshold} is below S3's minimum part size of {MIN_PART_SIZE} bytes"
            )
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.multipart_threshold = multipart_threshold
        self._key_prefix = f"{self.prefix}/" if self.prefix else ""
        self._exceptions = botocore.exceptions
        self._botocore_errors = (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError)
        self._bucket_checked = False
        if client is None:
            from trainguard.storage.options import resolve_storage_options

            resolved = resolve_storage_options(endpoint_url, profile_name, region_name)
            endpoint_url = resolved.endpoint_url
            # total_max_attempts counts the first try, like AWS_MAX_ATTEMPTS; botocore's own
            # "max_attempts" key counts retries only.
            retries: dict[str, Any] = {"mode": "standard"}
            if max_attempts is not None:
                retries["total_max_attempts"] = max_attempts
            elif not os.environ.get("AWS_MAX_ATTEMPTS"):
                retries["total_max_attempts"] = DEFAULT_MAX_ATTEMPTS
            options: dict[str, Any] = {}
            # botocore >= 1.36 adds checksum trailers to every upload by default, which many
            # S3-compatible servers reject; only send checksums where the API demands them,
            # unless the user chose otherwise. Older botocore has neither option nor trailers.
            for option in ("request_checksum_calculation", "response_checksum_validation"):
                if option in botocore.config.Config.OPTION_DEFAULTS and not os.environ.get(f"AWS_{option.upper()}"):
                    options[option] = "when_required"
            config = botocore.config.Config(
                retries=retries, connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S, **options
            )
            try:
                client = _new_session(botocore.session, resolved.profile).create_client(
                    "s3", endpoint_url=endpoint_url, region_name=resolved.region, config=config
                )
            except ValueError as error:  # botocore's answer to a malformed endpoint URL
                raise ConfigError(f"invalid S3 endpoint_url {endpoint_url!r}: {error}") from None
            except botocore.exceptions.BotoCoreError as error:
                raise ConfigError(f"cannot configure S3 for s3://{bucket}: {error}") from None
        self._client = client

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        client: Any = None,
        **options: Any,
    ) -> S3Store:
        """Open ``s3://bucket/prefix``; ``options`` go to the constructor."""
        if not url.startswith("s3://"):
            raise ConfigError(f"not an S3 URL: {url!r}; use s3://bucket/prefix")
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not bucket:
            raise ConfigError(f"{url!r} names no bucket: use s3://bucket/prefix")
        return cls(bucket, prefix, endpoint_url=endpoint_url, region_name=region_name, client=client, **options)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @property
    def endpoint_url(self) -> str:
        return str(self._client.meta.endpoint_url)

    def __repr__(self) -> str:
        return f"S3Store({self.url!r})"

    def full_key(self, key: str) -> str:
        return self._key_prefix + key

    def url_of(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.full_key(key)}"

    def open_writer(self, key: str) -> _S3Writer:
        return _S3Writer(self, key)

    def write(self, key: str, data: Buffer | Sequence[Buffer]) -> None:
        parts = [data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)
        if sum(_nbytes(part) for part in parts) > self.multipart_threshold:
            writer = self.open_writer(key)
            for part in parts:
                writer.write(part)
            writer.commit()
            return
        try:
            self._client.put_object(Bucket=self.bucket, Key=self.full_key(key), Body=b"".join(parts))
        except self._botocore_errors as error:
            raise self._error(error, "write", key) from error

    def read(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        if length is not None and length <= 0:
            self.size(key)  # a missing key still raises ObjectNotFound, as in the other stores
            return b""
        params = {"Bucket": self.bucket, "Key": self.full_key(key)}
        if start or length is not None:
            end = "" if length is None else str(start + length - 1)
            params["Range"] = f"bytes={start}-{end}"
        try:
            response = self._client.get_object(**params)
            return response["Body"].read()
        except self._botocore_errors as error:
            if _error_code(error) == "InvalidRange":
                return b""  # start lies at or past the end: the object exists, the slice is empty
            raise self._error(error, "read", key) from error

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        params = {"Bucket": self.bucket, "Prefix": self.full_key(prefix)}
        if start_after:
            params["StartAfter"] = self.full_key(start_after)
        cut = len(self._key_prefix)
        keys: list[str] = []
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(**params):
                for item in page.get("Contents", ()):
                    # Keys ending in "/" are folder markers made by consoles and sync tools: not objects.
                    if not item["Key"].endswith("/"):
                        keys.append(item["Key"][cut:])
        except self._botocore_errors as error:
            raise self._error(error, "list", prefix) from error
        keys.sort()
        return keys

    def exists(self, key: str) -> bool:
        try:
            self._head(key)
        except ObjectNotFound:
            return False
        return True

    def size(self, key: str) -> int:
        return int(self._head(key)["ContentLength"])

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self.full_key(key))
        except self._botocore_errors as error:
            mapped = self._error(error, "delete", key)
            if not isinstance(mapped, ObjectNotFound):
                raise mapped from error

    def _head(self, key: str) -> dict[str, Any]:
        try:
            return self._client.head_object(Bucket=self.bucket, Key=self.full_key(key))
        except self._botocore_errors as error:
            mapped = self._error(error, "stat", key)
            if isinstance(mapped, ObjectNotFound):
                # HEAD answers a bare 404 both for a missing key and a missing bucket.
                self._check_bucket()
            raise mapped from error

    def _check_bucket(self) -> None:
        # Once per store: buckets do not vanish mid-run, and exists() may be polled.
        if self._bucket_checked:
            return
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except self._botocore_errors as error:
            if _error_code(error) in ("404", "NoSuchBucket", "NotFound"):
                raise self._no_bucket_error() from error
            if not isinstance(error, self._exceptions.ClientError):
                raise self._error(error, "stat", None) from error
            # Anything else (403 without s3:ListBucket, say): cannot tell, so believe the key's 404.
        self._bucket_checked = True

    def _no_bucket_error(self) -> StorageError:
        endpoint = self.endpoint_url
        return StorageError(
            f"S3 bucket {self.bucket!r} does not exist at {endpoint}: create it first, e.g. "
            f"`aws s3 mb s3://{self.bucket} --endpoint-url {endpoint}`"
        )

    def _error(self, error: Exception, action: str, key: str | None) -> StorageError:
        """The StorageError to raise for a botocore error during ``action`` on ``key``."""
        where = self.url if key is None else self.url_of(key)
        exceptions = self._exceptions
        if isinstance(error, exceptions.ClientError):
            code = _error_code(error)
            message = error.response.get("Error", {}).get("Message") or ""
            if code in ("NoSuchKey", "404", "NotFound"):
                return ObjectNotFound(f"{where} does not exist")
            if code == "NoSuchBucket":
                return self._no_bucket_error()
            if code in _BAD_CREDENTIAL_CODES:
                return StorageError(
                    f"cannot {action} {where}: the endpoint {self.endpoint_url} rejected the credentials ({code}); "
                    "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN or AWS_PROFILE"
                )
            if code in ("AccessDenied", "403", "Forbidden", "AllAccessDisabled"):
                return StorageError(
                    f"cannot {action} {where}: access denied; the credentials need s3:GetObject, s3:PutObject and "
                    "s3:ListBucket on the bucket (S3 also answers 403 for a missing key without s3:ListBucket)"
                )
            return StorageError(f"cannot {action} {where}: {code} {message}".rstrip())
        if isinstance(error, (exceptions.NoCredentialsError, exceptions.PartialCredentialsError)):
            return StorageError(
                f"cannot {action} {where}: no AWS credentials found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(or AWS_PROFILE), or run where an instance or task role provides them"
            )
        if isinstance(error, exceptions.ConnectionError):  # unreachable, refused, connect timeout, proxy
            return StorageError(
                f"cannot {action} {where}: cannot reach the S3 endpoint {self.endpoint_url} ({error}); "
                "check endpoint_url / AWS_ENDPOINT_URL and that the server is running"
            )
        if isinstance(error, exceptions.HTTPClientError):  # read timeout, connection dropped mid-response
            return StorageError(f"cannot {action} {where}: the connection to {self.endpoint_url} failed: {error}")
        return StorageError(f"cannot {action} {where}: {error}")


_LOADER_LOCK = threading.Lock()
_shared_loader: Any = None


def _new_session(botocore_session: Any, profile: str | None = None) -> Any:
    """A fresh botocore session (so credentials and settings are read now) with a shared loader.

    Parsing botocore's JSON service models is most of the cost of a client (~0.1 s); the loader
    caches them, so sharing it makes every store after the first cheap. Sessions are created
    per store because a botocore session is not thread-safe and caches credentials.
    """
    global _shared_loader
    session = botocore_session.Session(profile=profile)
    with _LOADER_LOCK:
        if _shared_loader is None:
            _shared_loader = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _shared_loader)
    return session


def _error_code(error: Exception) -> str:
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return ""
    return str(response.get("Error", {}).get("Code", ""))
