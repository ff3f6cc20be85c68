"""``python -m trainguard.services.api``: run the control API with uvicorn (settings from the environment)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping

from trainguard.services.api.settings import ENVIRONMENT, Settings, secure_state

from trainguard.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainguard.services.api",
        description="trainguard control API",
        epilog="environment:\n" + "\n".join(f"  {key}: {text}" for key, text in ENVIRONMENT.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    return run_api(os.environ, args.log_level)


def run_api(environ: Mapping[str, str], log_level: str = "info") -> int:
    """Build the settings from ``environ`` and serve until interrupted (exit status 2: bad settings)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        settings = Settings.from_env(environ)
        secure_state(settings)  # data dir 0700, database 0600, umask 077 for everything created later
    except ConfigError as error:
        print(f"trainguard api: {error}", file=sys.stderr)
        return 2
    import uvicorn
    from trainguard.services.api.app import create_app

    try:
        app = create_app(settings)
    except ConfigError as error:  # settings read when the app is built (e.g. TRAINGUARD_MAX_BODY_BYTES)
        print(f"trainguard api: {error}", file=sys.stderr)
        return 2
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=log_level.lower())
    return 0


if __name__ == "__main__":
    sys.exit(main())
