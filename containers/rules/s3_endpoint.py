"""The compose stack's S3/CloudWatch/SNS endpoint: moto's server, its object bytes on a volume.

* Storage: moto keeps every object in a ``SpooledTemporaryFile``; an object larger than its
  buffer (moto's default: just under 5 MiB) spills into the temporary directory, a smaller one
  stays in memory. Here the buffer is one byte (``MOTO_S3_DEFAULT_KEY_BUFFER_SIZE``) and the
  temporary directory is ``--data-dir`` (the stack mounts a named volume there), so object bytes
  live on the disk and the process holds only metadata: the endpoint's capacity is the volume's,
  not a 64 MiB tmpfs or the container's memory. The files are unlinked temporary files, so a
  restart still comes back empty, with that space free again.
* Full: a write that would leave less than ``--min-free-mb`` free on the data volume is refused
  before moto reads it, and a write that still meets ENOSPC (or runs out of file descriptors)
  is answered the same way: HTTP 507 with the S3 error code ``StorageFull``, which the uploader
  reports as "S3 is full" and retries. A generic 500 would be indistinguishable from a bug.
  Reads, listings and deletes are never refused, so space can be freed.
* Admin routes: moto serves unauthenticated routes under ``/moto-api/`` (reset every backend,
  dump all data). Job containers share a network with this endpoint, so those routes answer only
  requests from inside this container (the healthcheck); everyone else gets 403. moto checks no
  credentials and has no IAM: it cannot confine a job to its own S3 prefix (a real S3 endpoint
  with per-job credentials can; see the API README's security section).

    python /opt/trainguard/s3_endpoint.py [--host 0.0.0.0] [--port 5000] [--data-dir /data] [--min-free-mb 1024]
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
import uuid
from collections.abc import Callable, Iterable
from typing import Any
from xml.sax.saxutils import escape

__all__ = ["StorageGuard", "guard", "main"]

_ADMIN_PREFIX = "/moto-api"
_LOOPBACK = {"127.0.0.1", "::1"}
# Errors that mean "no room for another object", whatever moto was doing when it met them.
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE}
STORAGE_FULL_CODE = "StorageFull"
STORAGE_FULL_STATUS = "507 Insufficient Storage"

log = logging.getLogger("trainguard.s3_endpoint")

WsgiApp = Callable[..., Iterable[bytes]]


def guard(app: WsgiApp) -> WsgiApp:
    """WSGI middleware: 403 for admin routes unless the caller is this container itself."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path.startswith(_ADMIN_PREFIX) and environ.get("REMOTE_ADDR") not in _LOOPBACK:
            body = b'{"message": "moto admin routes are closed on this endpoint"}'
            start_response("403 Forbidden", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        return app(environ, start_response)

    return guarded


class StorageGuard:
    """WSGI middleware: S3 writes that would fill the data volume get 507 ``StorageFull``.

    A write is a PUT with a body or a copy source (PutObject, UploadPart, CopyObject) or a
    CompleteMultipartUpload (POST with ``uploadId``), the requests that make moto store bytes.
    Everything else, deletes included, passes, so a full endpoint can be emptied.
    """

    def __init__(self, app: WsgiApp, data_dir: str, min_free_bytes: int) -> None:
        self.app = app
        self.data_dir = data_dir
        self.min_free_bytes = min_free_bytes

    def free_bytes(self) -> int:
        stat = os.statvfs(self.data_dir)
        return stat.f_bavail * stat.f_frsize

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        incoming = _write_size(environ)
        if incoming is not None:
            free = self.free_bytes()
            if free - incoming < self.min_free_bytes:
                self._drain(environ)
                return self._full(
                    environ, start_response,
                    f"the S3 endpoint's volume is full: {free} bytes free, a write of {incoming} bytes would leave "
                    f"less than the {self.min_free_bytes}-byte reserve; delete objects or give the volume more room",
                )  # fmt: skip
        try:
            return self.app(environ, start_response)
        except OSError as error:
            if error.errno not in _FULL_ERRNOS:
                raise
            message = f"the S3 endpoint could not store the object: {error.strerror}"
            if error.errno in (errno.EMFILE, errno.ENFILE):
                # Each stored object holds one open file: the descriptor limit caps the object count.
                message += "; it holds as many objects as its open-file limit (ulimit -n) allows"
            return self._full(environ, start_response, message)

    @staticmethod
    def _drain(environ: dict[str, Any]) -> None:
        """Read the refused body the client is sending, so it reads the answer, not a reset."""
        stream = environ.get("wsgi.input")
        length = _content_length(environ)
        while stream is not None and length > 0:
            chunk = stream.read(min(length, 1 << 16))
            if not chunk:
                break
            length -= len(chunk)

    def _full(self, environ: dict[str, Any], start_response: Callable[..., Any], message: str) -> list[bytes]:
        resource = environ.get("PATH_INFO", "")
        log.warning("refused %s %s: %s", environ.get("REQUEST_METHOD"), resource, message)
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{STORAGE_FULL_CODE}</Code><Message>{escape(message)}</Message>"
            f"<Resource>{escape(resource)}</Resource><RequestId>{uuid.uuid4().hex}</RequestId></Error>"
        ).encode()
        start_response(STORAGE_FULL_STATUS, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]


def _content_length(environ: dict[str, Any]) -> int:
    try:
        return max(0, int(environ.get("CONTENT_LENGTH") or 0))
    except ValueError:
        return 0


def _write_size(environ: dict[str, Any]) -> int | None:
    """Bytes an S3 request asks to store (0 when unknown, e.g. a copy); None for a non-write."""
    method = environ.get("REQUEST_METHOD", "")
    query = environ.get("QUERY_STRING", "")
    if method == "PUT":
        if environ.get("HTTP_X_AMZ_COPY_SOURCE"):
            return 0
        # aws-chunked bodies declare the object's own size beside the encoded length.
        declared = environ.get("HTTP_X_AMZ_DECODED_CONTENT_LENGTH")
        size = int(declared) if declared and declared.isdigit() else _content_length(environ)
        return size if size > 0 else None
    if method == "POST" and "uploadId=" in query:
        return 0
    return None


def _raise_open_file_limit() -> int:
    """Every stored object holds a descriptor (its temporary file): use the hard limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft


def main(argv: list[str] | None = None) -> int:
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--data-dir", default=env("TRAINGUARD_S3_DATA_DIR", "/data"),
                        help="where object bytes are stored (a volume); env TRAINGUARD_S3_DATA_DIR")  # fmt: skip
    parser.add_argument("--min-free-mb", type=float, default=float(env("TRAINGUARD_S3_MIN_FREE_MB", "1024")),
                        help="refuse writes that would leave less free on --data-dir; "
                        "env TRAINGUARD_S3_MIN_FREE_MB")  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="s3_endpoint: %(levelname)s %(message)s")
    if args.min_free_mb < 0:
        parser.error(f"--min-free-mb must be >= 0, got {args.min_free_mb}")
    if not os.path.isdir(args.data_dir) or not os.access(args.data_dir, os.W_OK | os.X_OK):
        parser.error(f"--data-dir {args.data_dir!r} is not a writable directory")
    import tempfile

    # Before moto is imported: its keys read both when they are created.
    os.environ["TMPDIR"] = args.data_dir
    tempfile.tempdir = args.data_dir
    os.environ.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", "1")
    os.environ.setdefault("MOTO_PORT", str(args.port))
    open_files = _raise_open_file_limit()

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import run_simple

    moto = DomainDispatcherApplication(create_backend_app)
    storage = StorageGuard(moto, args.data_dir, int(args.min_free_mb * 1024 * 1024))
    log.info(
        "object bytes in %s (%d MiB free, writes refused below %.0f MiB; %d open files allowed)",
        args.data_dir, storage.free_bytes() >> 20, args.min_free_mb, open_files,
    )  # fmt: skip
    run_simple(args.host, args.port, guard(storage), threaded=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
