"""``trainguard ui [PATH_OR_S3_URI ...] [--host H] [--port P] [--endpoint-url URL] [--profile NAME] [--region R]``."""

from __future__ import annotations

import argparse
import sys
import time

from trainguard.storage.options import add_storage_arguments

__all__ = ["register"]


def _ui(args: argparse.Namespace) -> int:
    from trainguard.storage import require_local_path
    from trainguard.ui import serve_paths

    for path in args.paths:
        require_local_path(path, "run or folder of runs")
    server = serve_paths(args.paths, host=args.host, port=args.port, endpoint_url=args.endpoint_url)
    print(f"trainguard: dashboard of {', '.join(args.paths) or 'trainguard-runs/'} at {server.url}", flush=True)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"trainguard: listening on {args.host}: anyone who can reach it can read these runs", file=sys.stderr)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ui", help="a live dashboard of runs in the browser (local or s3://)")
    parser.add_argument(
        "paths", nargs="*", metavar="PATH_OR_S3_URI",
        help="a run, a folder of runs, or s3://bucket/prefix (default trainguard-runs/)",
    )  # fmt: skip
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    parser.add_argument("--port", type=int, default=6007, help="port (default 6007; 0: any free port)")
    add_storage_arguments(parser)
    parser.set_defaults(func=_ui)
