"""``trainguard serve``: the control API as a verb of the ``trainguard`` command.

The core CLI never imports service code; it discovers this verb through the
``trainguard.commands`` entry-point group (see pyproject.toml), so ``pip install
'trainguard[service]'`` is all it takes. Command-line options override the environment variables
listed in :mod:`trainguard.services.api.settings`; everything else is read from the environment.
"""

from __future__ import annotations

import argparse
import os

__all__ = ["register"]

# option name -> the environment variable it overrides
_OVERRIDES = {
    "host": "TRAINGUARD_HOST",
    "port": "TRAINGUARD_PORT",
    "data_dir": "TRAINGUARD_DATA_DIR",
    "database_url": "TRAINGUARD_DATABASE_URL",
    "launcher": "TRAINGUARD_LAUNCHER",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the control API (native REST and SageMaker-compatible); needs trainguard[service]",
        description="Run the trainguard control API. The API token comes from TRAINGUARD_API_TOKEN "
        "(there is no default secret); `python -m trainguard.services.api --help` lists every setting.",
    )
    parser.add_argument("--host", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default 8080)")
    parser.add_argument("--data-dir", help="where jobs' files and the SQLite database live")
    parser.add_argument("--database-url", help="SQLAlchemy URL of the state database (e.g. postgresql+psycopg://...)")
    parser.add_argument("--launcher", choices=("local", "docker", "ray"), help="where jobs run")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    environ = dict(os.environ)
    for option, variable in _OVERRIDES.items():
        value = getattr(args, option)
        if value is not None:
            environ[variable] = str(value)
    from trainguard.services.api.__main__ import run_api

    return run_api(environ, args.log_level)
