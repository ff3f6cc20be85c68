"""The compose stack's S3/CloudWatch/SNS endpoint: moto's server with its admin routes closed.

moto serves unauthenticated admin routes under ``/moto-api/`` (reset every backend, dump all
data). Job containers share a network with this endpoint, so those routes answer only requests
from inside this container (the healthcheck); everyone else gets 403. moto checks no credentials
and has no IAM: it cannot confine a job to its own S3 prefix (a real S3 endpoint with per-job
credentials can; see the API README's security section).

    python /opt/trainguard/s3_endpoint.py [--host 0.0.0.0] [--port 5000]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from typing import Any

_ADMIN_PREFIX = "/moto-api"
_LOOPBACK = {"127.0.0.1", "::1"}


def guard(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """WSGI middleware: 403 for admin routes unless the caller is this container itself."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path.startswith(_ADMIN_PREFIX) and environ.get("REMOTE_ADDR") not in _LOOPBACK:
            body = b'{"message": "moto admin routes are closed on this endpoint"}'
            start_response("403 Forbidden", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        return app(environ, start_response)

    return guarded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=5000)
    args = parser.parse_args(argv)
    import os

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import run_simple

    os.environ.setdefault("MOTO_PORT", str(args.port))
    run_simple(args.host, args.port, guard(DomainDispatcherApplication(create_backend_app)), threaded=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
