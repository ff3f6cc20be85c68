"""``python -m trainguard``: the ``trainguard`` command (:func:`trainguard.cli.main`), for an
environment whose scripts directory is not on ``PATH``."""

from __future__ import annotations

import sys

from trainguard.cli import main

if __name__ == "__main__":
    sys.exit(main())
