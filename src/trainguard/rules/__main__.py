"""``python -m trainguard.rules RUN [--rule NAME[:key=value,...] ...]``: ``trainguard rules run``
as a process of its own (same options and exit codes); ``trainguard run --rules`` starts the
live rules this way (:mod:`trainguard.rules.autostop`).

An entry point, not part of the library: nothing imports it, so the rule framework stays below
the command line (``trainguard.commands.rules`` uses the runner, never the reverse).
"""

from __future__ import annotations

import sys

from trainguard.commands.rules import module_main

if __name__ == "__main__":
    sys.exit(module_main())
