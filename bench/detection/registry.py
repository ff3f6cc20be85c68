"""The corpus registry: every case with its label, family, builder and split.

A case's ``builder(out_dir, spec)`` trains and captures it (module-level functions, so cases
pickle into worker processes). ``expected`` names the rules any one of which is a right primary
diagnosis for a faulty case; ``onset`` is the first step the fault acts; ``symptom`` is what the
run's own metrics must show for the label to hold (checked by :func:`verify`).

About a quarter of the cases are held out of calibration: chosen by a hash of the name, so the
choice is fixed, independent of the order cases are listed in, and not made by looking at results.
"""

from __future__ import annotations

import math
import statistics
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HEALTHY, FAULTY = "healthy", "faulty"


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    label: str  # healthy | faulty
    builder: Callable[[str, Any], str]
    spec: Any
    expected: tuple[str, ...] = ()
    onset: int = 0
    symptom: str = "learns"  # see verify()
    description: str = ""

    @property
    def split(self) -> str:
        return "holdout" if zlib.crc32(self.name.encode()) % 4 == 0 else "calibration"

    @property
    def healthy(self) -> bool:
        return self.label == HEALTHY

    @property
    def save_interval(self) -> int:
        return int(getattr(self.spec, "save_interval", 1) or 1)


def verify(case: Case, metrics: dict[str, Any]) -> tuple[bool, str]:
    """Whether the run shows its label's symptom; returns (ok, what was seen)."""
    losses = metrics.get("losses") or []
    if metrics.get("symptom_checked") is not None:  # builders that judge themselves (XGBoost)
        return bool(metrics["symptom_checked"]), str(metrics.get("symptom_text", ""))
    if not losses:
        return False, "no losses recorded"
    head = statistics.fmean(losses[: max(1, len(losses) // 8)])
    tail_values = losses[-max(1, len(losses) // 8) :]
    finite = all(math.isfinite(value) for value in tail_values)
    tail = statistics.fmean(tail_values) if finite else float("nan")
    seen = f"loss {head:.4g} -> {tail:.4g}"
    if metrics.get("nonfinite"):
        seen += ", non-finite"
    unchanged = metrics.get("unchanged_parameters") or []
    if unchanged:
        seen += f", {len(unchanged)}/{metrics.get('parameters')} parameters unchanged"
    symptom = case.symptom
    if symptom in ("progress", "no_progress"):  # RL returns, GAN samples: see _progress
        return _progress(symptom, metrics, seen)
    if symptom == "learns":
        return (not metrics.get("nonfinite") and (tail < 0.8 * head or tail < 0.02)), seen
    if symptom == "stable":  # fine-tuning from a trained model: the loss must not rise
        return (not metrics.get("nonfinite") and tail <= 1.1 * head + 0.02), seen
    if symptom == "nonfinite":
        return bool(metrics.get("nonfinite")), seen
    if symptom == "no_learning":  # the loss never gets clearly below its initial value or chance level
        start = losses[0]
        chance = _chance_loss(metrics)
        stuck = not tail < 0.85 * start or (chance is not None and not tail < 0.85 * chance)
        return bool(metrics.get("nonfinite") or stuck), seen
    if symptom == "diverges":  # the loss runs away from its initial value (either sign) or goes non-finite
        return bool(metrics.get("nonfinite") or not abs(tail) < 10 * abs(losses[0])), seen
    if symptom == "chance_accuracy":  # the loss may fall, but the classifier ends at chance
        accuracies = metrics.get("accuracies") or []
        classes = int((metrics.get("spec") or {}).get("classes", 2))
        final = statistics.fmean(accuracies[-max(1, len(accuracies) // 8) :]) if accuracies else 1.0
        return final < 1.5 / classes, seen + f", training accuracy {final:.2f} ({classes} classes)"
    if symptom == "frozen":
        return bool(unchanged), seen
    if symptom == "overfit":
        val = [value for _, value in metrics.get("val_losses") or []]
        ok = len(val) >= 3 and val[-1] > 1.3 * min(val) and tail < head
        return ok, seen + (f", validation {min(val):.3g} (min) -> {val[-1]:.3g}" if val else "")
    if symptom == "by_construction":  # a property of the data itself (scale, padding, imbalance)
        return True, seen + " (fault is in the data by construction)"
    raise ValueError(f"unknown symptom {symptom!r}")


def _progress(symptom: str, metrics: dict[str, Any], seen: str) -> tuple[bool, str]:
    """Runs whose loss is not what improves when they learn (an agent's return-weighted
    log-probabilities, a GAN's two players) record ``progress``: values that rise as the run
    learns (episode returns; how much of the gap between samples and data has closed) and the
    ``progress_goal`` the program states for "learned" (a random policy, an untrained generator
    stay far below it). "progress": the last eighth's mean reaches the goal, its first eighth's
    does not; "no_progress": the last eighth's mean stays below the goal, or values went
    non-finite."""
    values = [float(value) for value in metrics.get("progress") or []]
    goal = metrics.get("progress_goal")
    if not values or goal is None:
        return False, seen + ", no progress recorded"
    count = max(1, len(values) // 8)
    head, tail = statistics.fmean(values[:count]), statistics.fmean(values[-count:])
    seen += f", {metrics.get('progress_text') or 'progress'} {head:.3g} -> {tail:.3g} (goal {goal:g})"
    finite = math.isfinite(tail) and not metrics.get("nonfinite")
    if symptom == "progress":
        return finite and tail >= goal > head, seen
    return (not finite or tail < goal), seen


def _chance_loss(metrics: dict[str, Any]) -> float | None:
    """Cross-entropy of a uniform guess, for single-label classification runs."""
    spec = metrics.get("spec") or {}
    if spec.get("loss", "ce") != "ce" or spec.get("task") not in ("features", "images", "tokens", "sequences"):
        return None
    return math.log(max(2, int(spec.get("classes", 2))))
