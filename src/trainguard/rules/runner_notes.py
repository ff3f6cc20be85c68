"""The rule runner's notes on a run whose data cannot back a "no issues" verdict: capture that
stopped early, damaged files, data a rule missed."""

from __future__ import annotations

from typing import Any

__all__ = ["capture_stopped_note", "damage_note", "describe_missing"]


def capture_stopped_note(trial: Any) -> str:
    """Why some worker's capture ended before training did (the hook's capture_stopped/
    record: a full disk, an internal error), or ""."""
    try:
        stopped = trial.capture_stopped()
    except Exception:  # noqa: BLE001 - the verdict stands without the note
        return ""
    parts = [f"{worker} at step {info.get('step')} ({info.get('reason')})" for worker, info in sorted(stopped.items())]
    return f"capture stopped early on {', '.join(parts)}; later steps were never written" if parts else ""


def damage_note(trial: Any) -> str:
    """The run's damaged files (Trial.damage: truncated or missing index, index entries
    without their checksum, corrupt records), the first one named with its step, or ""."""
    try:
        damage = trial.damage()
    except Exception:  # noqa: BLE001 - the verdict stands without the note
        return ""
    if not damage:
        return ""
    first = damage[0]
    where = (
        f"step {first.step}" + (f" of {first.worker}" if first.worker else "")
        if first.step is not None
        else "a file"
    )
    more = f"; {len(damage) - 1} more damaged file(s)" if len(damage) > 1 else ""
    return f"{where} is damaged: {first.key}: {first.problem}{more}"


def describe_missing(item: dict[str, Any]) -> str:
    collection = item.get("collection")
    what = item.get("what", "")
    if collection:
        return f"{what} (save the collection {collection!r} in the hook config)"
    return str(what)
