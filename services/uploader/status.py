"""What the uploader says about its state on its output, and how the reconciler reads it back.

The uploader's output is the one channel every launcher gives back (a local process's log file,
``docker logs``, a Ray job's logs, also when the uploader runs on another node than the API), so
its state is told there in two fixed lines, defined here once for the writer
(``python -m trainguard.services.uploader``) and the reader (``services/api/reconciler.py``):

- :func:`ready_line`, once its SIGTERM handler is in place (told "training ended" earlier, an
  uploader still starting dies of the signal instead of finishing);
- :func:`final_record`, its last line: ``{"uploader": "done" | "stopped" | "failed", ...counts}``
  (``stopped``: told to finish, it sent the rest, verified S3 and wrote the end marker last).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["READY", "final_record", "finished_after_stop", "ready_line", "said_ready"]

READY = "uploader: following"
_STOPPED = json.dumps({"uploader": "stopped"})[:-1]  # the final record's start, whatever follows


def ready_line(source: str, dest: str) -> str:
    return f"{READY} {source} -> {dest}"


def final_record(outcome: str, summary: dict[str, Any]) -> str:
    """The uploader's last line; ``outcome`` first, so a reader finds it by its start."""
    return json.dumps({"uploader": outcome, **summary})


def said_ready(log: str, restart_note: str) -> bool:
    """Whether the uploader whose output is ``log`` said it is ready since the launcher's last
    ``restart_note`` in the same log (a restarted uploader must say so again)."""
    return log.rfind(READY) > log.rfind(restart_note)


def finished_after_stop(log: str) -> bool:
    """Whether the last uploader in ``log`` ended with its clean final record after being told to
    finish (its last pass done, the end marker last)."""
    return log.rfind(_STOPPED) > log.rfind(READY) >= 0
