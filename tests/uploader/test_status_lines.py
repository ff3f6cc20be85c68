"""The uploader's two state lines (services/uploader/status.py) as the reconciler reads them back
from a component log, with the launchers' restart note between runs."""

from __future__ import annotations

import json

from trainguard.services.uploader.status import final_record, finished_after_stop, ready_line, said_ready

RESTART = "trainguard launcher: restarting uploader (restart 1)"  # as the local and Ray launchers write it
NOTE = "restarting uploader"  # what the reconciler looks for


def _log(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def test_ready_only_once_said_since_the_last_restart() -> None:
    ready = ready_line("/runs/j1", "s3://bucket/j1")
    assert not said_ready(_log("importing..."), NOTE)
    assert said_ready(_log("uploader: INFO starting", ready), NOTE)
    assert not said_ready(_log(ready, "killed", RESTART), NOTE)  # the restarted one has not said it yet
    assert said_ready(_log(ready, RESTART, ready), NOTE)


def test_finished_after_stop_needs_the_stopped_record_after_the_last_start() -> None:
    ready = ready_line("/runs/j1", "s3://bucket/j1")
    stopped = final_record("stopped", {"files": 3, "bytes": 10})
    assert json.loads(stopped) == {"uploader": "stopped", "files": 3, "bytes": 10}
    assert finished_after_stop(_log(ready, stopped))
    assert not finished_after_stop(_log(stopped))  # no start line: not this uploader's record
    assert not finished_after_stop(_log(ready, stopped, RESTART, ready))  # restarted since
    assert not finished_after_stop(_log(ready, final_record("done", {})))  # ended by itself, not told
    assert not finished_after_stop(_log(ready, final_record("failed", {})))
