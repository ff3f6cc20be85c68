"""``python -m services.api``: run the control API with uvicorn (settings from the environment)."""

from __future__ import annotations

import argparse
import logging
import sys

from services.api.settings import ENVIRONMENT, Settings
from trainguard.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.api",
        description="trainguard control API",
        epilog="environment:\n" + "\n".join(f"  {key}: {text}" for key, text in ENVIRONMENT.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        settings = Settings.from_env()
    except ConfigError as error:
        print(f"trainguard api: {error}", file=sys.stderr)
        return 2
    import uvicorn

    from services.api.app import create_app

    app = create_app(settings)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=args.log_level.lower())
    return 0


if __name__ == "__main__":
    sys.exit(main())
