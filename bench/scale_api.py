"""The control API with its database writes counted, for ``bench/scale.py``.

Runs ``python -m trainguard.services.api`` unchanged, after registering SQLAlchemy listeners on
every engine (class-level events, so no service code changes): commits and INSERT/UPDATE/DELETE
statements are counted and written as JSON to ``$TRAINGUARD_SCALE_COUNTS`` every 0.5 s.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import Engine

_counts = {"commits": 0, "writes": 0, "statements": 0}
_lock = threading.Lock()


@event.listens_for(Engine, "commit")
def _on_commit(_connection) -> None:  # noqa: ANN001 - SQLAlchemy connection
    with _lock:
        _counts["commits"] += 1


@event.listens_for(Engine, "before_cursor_execute")
def _on_statement(_connection, _cursor, statement: str, *_rest) -> None:  # noqa: ANN001
    verb = statement.lstrip()[:6].upper()
    with _lock:
        _counts["statements"] += 1
        if verb in ("INSERT", "UPDATE", "DELETE"):
            _counts["writes"] += 1


def _dump_forever(path: Path) -> None:
    while True:
        with _lock:
            text = json.dumps(_counts)
        path.with_suffix(".tmp").write_text(text)
        path.with_suffix(".tmp").replace(path)  # readers never see half a file
        time.sleep(0.5)


if __name__ == "__main__":
    threading.Thread(target=_dump_forever, args=(Path(os.environ["TRAINGUARD_SCALE_COUNTS"]),), daemon=True).start()
    from trainguard.services.api.__main__ import main

    sys.exit(main(sys.argv[1:]))
