"""The upload loop: scan the source, upload what is new in reader-safe order, remember it."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.services.errors import ServiceError
from trainguard.services.uploader.state import UploadState
from trainguard.services.uploader.status import StatusWriter, default_status_path

from trainguard.format.layout import (
    END_OF_TRAINING,
    RUN_EXIT_RECORD,
    event_key,
    is_collections_key,
    parse_index_key,
)

__all__ = ["UploadStats", "Uploader", "UploaderError", "is_storage_full", "parse_s3_url"]

log = logging.getLogger("trainguard.uploader")

# Files other than events/index/collections (profiler JSON lines, TensorBoard, rule output) may be
# appended in place; they go up once they have been quiet this long (again whenever they change).
_QUIET_S = 1.0
_MULTIPART_THRESHOLD = 64 * 1024 * 1024


# How S3 endpoints say they have no room: HTTP 507 (the stack's endpoint: StorageFull; MinIO:
# XMinioStorageFull), or a quota (Ceph RGW: QuotaExceeded). Retried like any failure, but named.
_FULL_CODES = frozenset({"StorageFull", "XMinioStorageFull", "InsufficientStorage", "QuotaExceeded"})
_FULL_HTTP_STATUS = 507


class UploaderError(ServiceError, RuntimeError):
    """Bad configuration, or S3 kept failing past the give-up time."""


def is_storage_full(error: BaseException | None) -> bool:
    """True when an S3 error says the endpoint (or the caller's quota) has no room left."""
    seen = 0
    while error is not None and not isinstance(getattr(error, "response", None), dict) and seen < 5:
        error, seen = error.__context__, seen + 1  # S3UploadFailedError: the ClientError it was raised from
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return False
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status == _FULL_HTTP_STATUS or _error_code(error) in _FULL_CODES


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix without trailing slash)."""
    if not url.startswith("s3://") or len(url) <= 5:
        raise UploaderError(f"destination must look like s3://bucket/prefix, got {url!r}")
    bucket, _, prefix = url[5:].partition("/")
    if len(bucket) < 3:
        raise UploaderError(f"S3 bucket name {bucket!r} in {url!r} is too short (3 characters at least)")
    return bucket, prefix.strip("/")


@dataclass
class UploadStats:
    files: int = 0
    bytes: int = 0
    puts: int = 0
    skipped_existing: int = 0  # found already on S3 after a restart (HEAD matched), not re-sent
    resent: int = 0  # recorded as sent, then found missing on S3 (endpoint wiped, bucket deleted): sent again
    verifications: int = 0  # listings of the destination compared with the state
    full_refusals: int = 0  # S3 calls the endpoint refused for lack of room (retried)
    lags_s: list[float] = field(default_factory=list)  # upload done - file mtime

    def counts(self) -> dict[str, int]:
        """The counters alone: cheap enough for every pass's status."""
        return {
            "files": self.files, "bytes": self.bytes, "puts": self.puts, "skipped_existing": self.skipped_existing,
            "resent": self.resent, "verifications": self.verifications, "full_refusals": self.full_refusals,
        }

    def summary(self) -> dict[str, Any]:
        lags = sorted(self.lags_s)

        def pct(q: float) -> float | None:
            return round(lags[min(len(lags) - 1, int(q * len(lags)))], 3) if lags else None

        return {
            "files": self.files, "bytes": self.bytes, "puts": self.puts,
            "skipped_existing": self.skipped_existing, "resent": self.resent, "full_refusals": self.full_refusals,
            "lag_p50_s": pct(0.5), "lag_p95_s": pct(0.95), "lag_max_s": round(lags[-1], 3) if lags else None,
        }


@dataclass(frozen=True)
class _LocalFile:
    key: str  # relative to the source root, '/'-separated
    path: Path
    size: int
    mtime_ns: int


class Uploader:
    """Upload one run directory to ``s3://bucket/prefix``; resumable through ``state_file``."""

    def __init__(
        self,
        source: str | Path,
        destination: str,
        *,
        endpoint_url: str | None = None,
        state_file: str | Path | None = None,
        poll_interval: float = 0.5,
        give_up_after_s: float = 600.0,
        drain_s: float = 5.0,
        create_bucket: bool = True,
        client: Any | None = None,
        stop_event: threading.Event | None = None,
        verify_interval_s: float = 10.0,
        status_file: str | Path | None = None,
    ) -> None:
        if poll_interval <= 0:
            raise UploaderError(f"poll interval must be > 0 seconds, got {poll_interval}")
        if not verify_interval_s > 0:
            raise UploaderError(f"verify interval must be > 0 seconds, got {verify_interval_s}")
        self.source = Path(source)
        self.destination = destination
        self.bucket, self.prefix = parse_s3_url(destination)
        self.poll_interval = poll_interval
        self.give_up_after_s = give_up_after_s
        self.drain_s = drain_s
        self.stop_event = stop_event or threading.Event()
        self.stats = UploadStats()
        state_path = Path(state_file) if state_file else self.source / ".uploader-state.json"
        self.state = UploadState(state_path, destination)
        self.status = StatusWriter(Path(status_file) if status_file else default_status_path(state_path))
        self._client = client or _make_client(endpoint_url)
        self._create_bucket = create_bucket
        # Files present at (re)start that the state does not list may have gone up just before a
        # kill: HEAD them before any PUT. Filled by the first listing.
        self._unverified: set[str] | None = None
        self._index_targets: dict[str, str | None] = {}
        # What the state says is sent is checked against a listing of the destination every
        # verify_interval_s and always before the end marker: an endpoint restarted empty or a
        # deleted bucket must cost re-uploads, never files missing behind a finished run.
        self.verify_interval_s = verify_interval_s
        self._next_verify = 0.0  # monotonic time; 0 = at the first round

    # -- public ---------------------------------------------------------------------------------
    def run(self) -> UploadStats:
        """Upload until the end marker is up.

        When ``stop_event`` is set (SIGTERM: training is over, or the job is being stopped) it keeps
        following for up to ``drain_s`` so the training's last steps and end marker still go up,
        then makes final passes that upload whatever is there, verify it on S3 and put the end
        marker last, writing one itself when training wrote none (a run that captured nothing
        still ends, so its rules end). Raises :class:`UploaderError` naming the files not on S3
        when S3 kept failing past ``give_up_after_s``.
        """
        self.status.set_state("following", self.stats.counts())
        try:
            stats = self._run()
        except UploaderError as error:
            missing = self.missing()
            if not missing:
                self.status.set_state("failed", self.stats.counts(), str(error))
                raise
            shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
            named = UploaderError(f"{error}; {len(missing)} file(s) not on S3: {shown}")
            self.status.set_state("failed", self.stats.counts(), str(named))
            raise named from error
        self.status.set_state("stopped" if self.stop_event.is_set() else "done", stats.counts())
        return stats

    def _run(self) -> UploadStats:
        self._with_retries("check bucket", self._ensure_bucket)
        while True:
            if self.scan_once():
                return self.stats
            if self.stop_event.wait(self.poll_interval):
                break
        self.status.set_state("finishing", self.stats.counts())
        deadline = time.monotonic() + self.drain_s
        while time.monotonic() < deadline:
            if self.scan_once():
                return self.stats
            time.sleep(min(self.poll_interval, 0.2))
        give_up = time.monotonic() + self.give_up_after_s
        while not self.scan_once(final=True):
            if time.monotonic() > give_up:
                raise UploaderError(f"files kept disappearing from S3 for {self.give_up_after_s:.0f} s")
            time.sleep(min(self.poll_interval, 0.2))
        return self.stats

    def missing(self) -> list[str]:
        """Local files (end marker aside) that are not recorded as on S3 as they are now."""
        return sorted(
            key for key, item in self._list().items()
            if key != END_OF_TRAINING and not self.state.is_current(key, item.size, item.mtime_ns)
        )

    def scan_once(self, final: bool = False) -> bool:
        """One round; True once the end marker is uploaded and nothing else is pending."""
        try:
            return self._scan(final)
        finally:
            self.state.flush()
            self.status.passed(self.stats.counts())

    def _scan(self, final: bool) -> bool:
        if time.monotonic() >= self._next_verify:
            self._verify_remote()
        # Read before the listing: a final record read here is the one the listing sees (it is
        # replaced by a rename), so it goes up before the end marker.
        command_running = _command_still_running(self.source / RUN_EXIT_RECORD)
        files = self._list()
        if self._unverified is None:
            self._unverified = {key for key in files if key not in self.state}
        end_marker = files.pop(END_OF_TRAINING, None)
        training_over = end_marker is not None or final
        pending = [f for f in files.values() if not self.state.is_current(f.key, f.size, f.mtime_ns)]
        plain, collections, indexes = [], [], []
        for item in pending:
            if parse_index_key(item.key) is not None:
                indexes.append(item)
            elif is_collections_key(item.key):
                collections.append(item)
            elif item.key.startswith("events/") or training_over or time.time() - item.mtime_ns / 1e9 >= _QUIET_S:
                plain.append(item)
        waiting = len(pending) - len(plain) - len(collections) - len(indexes)
        for item in sorted(plain, key=lambda f: f.key) + sorted(collections, key=lambda f: f.key):
            self._upload(item)
        for item in sorted(indexes, key=lambda f: f.key):
            target = self._index_target(item)
            if target is None or self.state.is_current(target, *_stat(files.get(target))) or (
                training_over and target not in files
            ):
                self._upload(item)
            else:
                waiting += 1  # its event file is not up yet (written after this round's listing)
        if waiting or (end_marker is None and not final):
            return False
        if not final and command_running:
            return False  # `trainguard run` writes how training ended after the hook's end marker
        # Everything is up: check that S3 really holds it before the end marker says so.
        if self._verify_remote(required=True):
            return False  # something vanished: the next round sends it again
        if end_marker is None:
            if END_OF_TRAINING not in self.state:
                self._put_end_marker()
        elif not self.state.is_current(end_marker.key, end_marker.size, end_marker.mtime_ns):
            self._upload(end_marker)
        return True

    # -- internals ------------------------------------------------------------------------------
    def _list(self) -> dict[str, _LocalFile]:
        files: dict[str, _LocalFile] = {}
        if not self.source.is_dir():
            return files
        for directory, subdirectories, names in os.walk(self.source):
            # Hidden entries are writers' temp files and this uploader's own state.
            subdirectories[:] = [d for d in subdirectories if not d.startswith(".")]
            for name in names:
                if name.startswith("."):
                    continue
                path = Path(directory) / name
                try:
                    info = path.stat()
                except FileNotFoundError:
                    continue  # renamed or removed between listing and stat
                key = path.relative_to(self.source).as_posix()
                files[key] = _LocalFile(key, path, info.st_size, info.st_mtime_ns)
        return files

    def _index_target(self, item: _LocalFile) -> str | None:
        """The event file an index points at (meta.event_file_name, else the layout's name)."""
        if item.key in self._index_targets:
            return self._index_targets[item.key]
        parsed = parse_index_key(item.key)
        target: str | None = event_key(parsed.step, parsed.worker) if parsed else None
        try:
            meta = json.loads(item.path.read_bytes()).get("meta", {})
            name = meta.get("event_file_name")
            if isinstance(name, str) and name and not name.startswith("/"):
                target = name
            elif "event_file_name" not in meta:
                target = None  # reduction-only step: no event file to wait for
        except (OSError, ValueError, AttributeError):
            pass  # unreadable index: fall back to the layout's event file name
        self._index_targets[item.key] = target
        return target

    def _s3_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _upload(self, item: _LocalFile) -> None:
        s3_key = self._s3_key(item.key)
        if self._unverified and item.key in self._unverified:
            self._unverified.discard(item.key)
            if self._already_there(item, s3_key):
                self.state.record(item.key, item.size, item.mtime_ns)
                self.stats.skipped_existing += 1
                return
        if item.size >= _MULTIPART_THRESHOLD:
            self._with_retries(item.key, lambda: self._client.upload_file(str(item.path), self.bucket, s3_key))
        else:
            try:
                body = item.path.read_bytes()
            except FileNotFoundError:
                return  # removed since the listing; nothing to upload
            self._with_retries(item.key, lambda: self._client.put_object(Bucket=self.bucket, Key=s3_key, Body=body))
        self.stats.puts += 1
        self.state.record(item.key, item.size, item.mtime_ns)
        self.stats.files += 1
        self.stats.bytes += item.size
        self.stats.lags_s.append(max(0.0, time.time() - item.mtime_ns / 1e9))

    def _put_end_marker(self) -> None:
        """Training ended without writing one (nothing captured, or killed): write it on S3 ourselves."""
        s3_key = self._s3_key(END_OF_TRAINING)
        self._with_retries(END_OF_TRAINING, lambda: self._client.put_object(Bucket=self.bucket, Key=s3_key, Body=b""))
        self.stats.puts += 1
        self.state.record(END_OF_TRAINING, 0, -1)
        log.info("training ended without an end marker: wrote %s", END_OF_TRAINING)

    def _verify_remote(self, required: bool = False) -> int:
        """List the destination, forget every recorded file S3 lacks (or holds at another size).

        Returns how many were forgotten; the following rounds upload them again, in the usual
        reader-safe order. A vanished bucket is created again first. ``required`` (before the
        end marker): retried like any S3 call until it succeeds or the give-up time is over;
        otherwise (the periodic check) a failed listing is tried again at a later round.
        """
        import botocore.exceptions

        started = time.monotonic()
        prefix = f"{self.prefix}/" if self.prefix else ""

        def listing() -> dict[str, int]:
            remote: dict[str, int] = {}
            try:
                for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                    for entry in page.get("Contents", []):
                        remote[entry["Key"][len(prefix):]] = int(entry.get("Size", -1))
            except botocore.exceptions.ClientError as error:
                if _error_code(error) != "NoSuchBucket" or not self._create_bucket:
                    raise
                log.warning("bucket %s is gone: creating it again and re-sending everything", self.bucket)
                self._ensure_bucket()
                return {}
            return remote

        if required:
            remote = self._with_retries("verify the destination", listing)
        else:
            try:
                remote = listing()
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as error:
                log.warning("could not list s3://%s/%s to verify (%s); will try again", self.bucket, prefix, error)
                self._next_verify = time.monotonic() + min(self.verify_interval_s, 2.0)
                return 0
        self.stats.verifications += 1
        lost = [
            key for key in self.state.keys()
            if remote.get(key) != self.state.size_of(key) and not (key == END_OF_TRAINING and key in remote)
        ]
        for key in lost:
            self.state.forget(key)
            self._index_targets.pop(key, None)
        if lost:
            self.stats.resent += len(lost)
            shown = ", ".join(sorted(lost)[:5]) + (" ..." if len(lost) > 5 else "")
            log.warning("%d file(s) recorded as sent are not on S3 (%s): sending them again", len(lost), shown)
        # A large run's listing costs more: never spend more than a tenth of the time listing.
        self._next_verify = time.monotonic() + max(self.verify_interval_s, 10 * (time.monotonic() - started))
        return len(lost)

    def _already_there(self, item: _LocalFile, s3_key: str) -> bool:
        """After a restart: a file PUT just before the kill is on S3 but not in the state."""
        import botocore.exceptions

        try:
            head = self._client.head_object(Bucket=self.bucket, Key=s3_key)
        except botocore.exceptions.ClientError:
            return False
        if head.get("ContentLength") != item.size:
            return False
        etag = str(head.get("ETag", "")).strip('"')
        if "-" in etag:  # multipart ETag is not an MD5 of the content
            return False
        return etag == hashlib.md5(item.path.read_bytes(), usedforsecurity=False).hexdigest()

    def _ensure_bucket(self) -> None:
        import botocore.exceptions

        try:
            self._client.head_bucket(Bucket=self.bucket)
        except botocore.exceptions.ClientError as error:
            code = _error_code(error)
            if code not in ("404", "NoSuchBucket", "NotFound") or not self._create_bucket:
                raise
            self._client.create_bucket(Bucket=self.bucket)

    def _with_retries(self, what: str, action: Any) -> Any:
        """Retry S3 failures with exponential backoff (0.2 s doubling to 10 s) up to the give-up time."""
        import boto3.exceptions
        import botocore.exceptions

        # upload_file (multipart) wraps the endpoint's ClientError in S3UploadFailedError.
        retried = (
            botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, boto3.exceptions.S3UploadFailedError
        )
        deadline = time.monotonic() + self.give_up_after_s
        delay = 0.2
        while True:
            try:
                return action()
            except retried as error:
                if (
                    isinstance(error, botocore.exceptions.ClientError)
                    and _error_code(error) == "NoSuchBucket"
                    and self._create_bucket
                ):
                    # The endpoint lost the bucket (restarted empty): create it again, and check
                    # everything recorded as sent at the next round.
                    self._next_verify = 0.0
                    try:
                        self._ensure_bucket()
                    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
                        pass  # retried below like any S3 failure
                full = is_storage_full(error)
                self.stats.full_refusals += full
                if time.monotonic() + delay > deadline:
                    if full:
                        raise UploaderError(
                            f"S3 is full: s3://{self.bucket}/{self.prefix} refused {what} for "
                            f"{self.give_up_after_s:.0f} s: {error}"
                        ) from error
                    raise UploaderError(
                        f"S3 kept failing for {self.give_up_after_s:.0f} s on {what} "
                        f"(s3://{self.bucket}/{self.prefix}): {error}"
                    ) from error
                if full:
                    log.warning("S3 is full (%s): %s waits; retrying in %.1f s", error, what, delay)
                else:
                    log.warning("S3 error on %s (%s); retrying in %.1f s", what, error, delay)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)


def _error_code(error: Any) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))


def _command_still_running(record: Path) -> bool:
    """True while ``trainguard run``'s exit record says its command has not exited yet."""
    try:
        content = json.loads(record.read_bytes())
    except (OSError, ValueError):
        return False  # gone or half-written by another writer: not a reason to hold the end back
    return isinstance(content, dict) and "returncode" in content and content["returncode"] is None


def _stat(item: _LocalFile | None) -> tuple[int, int]:
    return (item.size, item.mtime_ns) if item else (-1, -1)


def _make_client(endpoint_url: str | None) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError as error:
        raise UploaderError("the uploader needs boto3: pip install 'trainguard[s3]'") from error
    config = Config(
        retries={"max_attempts": 2, "mode": "standard"},  # our own backoff does the long waits
        connect_timeout=5,
        read_timeout=30,
        s3={"addressing_style": "path"},  # S3-compatible endpoints (moto, MinIO) by service name
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url or None, config=config)
