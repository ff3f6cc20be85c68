"""A short human summary of a run: steps, tensors, sizes, where."""

from __future__ import annotations

from trainguard.format.layout import EVENTS_PREFIX
from trainguard.modes import ModeKeys
from trainguard.trial import Trial

__all__ = ["describe_run", "format_bytes"]


def format_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} B"


def describe_run(trial: Trial) -> dict[str, object]:
    """Facts about a run, cheap to compute (sizes come from the index, not from reading data)."""
    state = trial._state
    event_bytes = sum(
        entry.length for record in state.steps.values() for index in record.workers.values() for entry in index.tensors
    )
    per_mode = {mode.name: len(trial.steps(mode)) for mode in trial.modes()}
    names = trial.tensor_names()
    by_collection = {
        name: len(trial.tensor_names(collection=name))
        for name in ("weights", "biases", "gradients", "losses", "outputs")
        if name in trial.collections()
    }
    return {
        "path": trial.path,
        "steps": len(trial.steps()),
        "steps_per_mode": per_mode,
        "tensors": len(names),
        "tensors_per_collection": {k: v for k, v in by_collection.items() if v},
        "reduction_tensors": len(trial.tensor_names(show_prefixed_tensors=True)) - len(names),
        "bytes": event_bytes,
        "workers": trial.workers(),
        "ended": trial.training_ended,
        "event_files_prefix": f"{trial.path.rstrip('/')}/{EVENTS_PREFIX}",
        "first_step": min(trial.steps(), default=None),
        "last_step": max(trial.steps(), default=None),
        "loss_names": trial.tensor_names(collection="losses") if "losses" in trial.collections() else [],
        "modes": [mode.name for mode in trial.modes() if mode != ModeKeys.GLOBAL],
    }


def render_summary(facts: dict[str, object]) -> str:
    modes = ", ".join(f"{mode} {count}" for mode, count in facts["steps_per_mode"].items())  # type: ignore[union-attr]
    collections = ", ".join(f"{name} {count}" for name, count in facts["tensors_per_collection"].items())  # type: ignore[union-attr]
    lines = [
        f"trainguard: captured run at {facts['path']}",
        f"  steps saved : {facts['steps']} ({modes}), global steps {facts['first_step']}..{facts['last_step']}",
        f"  tensors     : {facts['tensors']} ({collections})"
        + (f" + {facts['reduction_tensors']} reductions" if facts["reduction_tensors"] else ""),
        f"  data        : {format_bytes(int(facts['bytes']))} in event files, workers {', '.join(facts['workers'])}",  # type: ignore[arg-type]
        f"  losses      : {', '.join(facts['loss_names']) or 'none captured'}",  # type: ignore[arg-type]
        f"  finished    : {'yes' if facts['ended'] else 'no (run still live or crashed)'}",
        f"  read it     : from trainguard.trials import create_trial; create_trial({str(facts['path'])!r})",
    ]
    return "\n".join(lines)
