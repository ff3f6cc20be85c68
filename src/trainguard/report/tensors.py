"""The tensor side of a report: curves, norms, histograms and zero fractions read from a trial.

Reading is planned per step: every value a report needs at one global step is fetched with one
``trial.tensor_values`` call (one read per event file), and long runs are subsampled to at most
``max_points`` steps per curve, so a 1,000-step run is read in seconds.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from trainguard.errors import FormatError, TensorUnavailable, TensorUnavailableForStep, TrialError
from trainguard.modes import ModeKeys
from trainguard.reductions import numpy_reduction
from trainguard.report.charts import Chart, Series
from trainguard.trial import Trial

__all__ = ["TensorSections", "gather_tensor_sections", "pick_histogram_steps", "subsample"]

SCALAR_COLLECTIONS = ("losses", "scalars", "metrics", "sm_metrics")
ACTIVATION_COLLECTIONS = ("relu_output", "outputs")
SERIES_PER_CHART = 12
MAX_HISTOGRAM_TENSORS = 24

logger = logging.getLogger("trainguard")


@dataclass
class TensorSections:
    """Charts for each tensor section of the report, and notes for the ones without data."""

    scalar_charts: list[Chart] = field(default_factory=list)
    weight_norm_charts: list[Chart] = field(default_factory=list)
    bias_norm_charts: list[Chart] = field(default_factory=list)
    gradient_norm_charts: list[Chart] = field(default_factory=list)
    histogram_charts: list[Chart] = field(default_factory=list)
    activation_charts: list[Chart] = field(default_factory=list)
    histogram_steps: list[int] = field(default_factory=list)
    notes: dict[str, list[str]] = field(default_factory=dict)

    def note(self, section: str, text: str) -> None:
        self.notes.setdefault(section, []).append(text)


def subsample(steps: Sequence[int], max_points: int) -> list[int]:
    """At most ``max_points`` steps, evenly spread, always keeping the first and the last."""
    ordered = sorted(set(steps))
    if max_points < 2 or len(ordered) <= max_points:
        return ordered
    positions = np.linspace(0, len(ordered) - 1, max_points).round().astype(int)
    return [ordered[i] for i in sorted(set(positions.tolist()))]


def pick_histogram_steps(available: Sequence[int], requested: Sequence[int] | None) -> tuple[list[int], list[str]]:
    """First, middle and last saved step by default; requested steps snap to the nearest saved one."""
    ordered = sorted(set(available))
    if not ordered:
        return [], []
    if not requested:
        return sorted({ordered[0], ordered[len(ordered) // 2], ordered[-1]}), []
    chosen, notes = [], []
    for step in requested:
        nearest = min(ordered, key=lambda saved: (abs(saved - step), saved))
        if nearest != step:
            notes.append(f"step {step} has no saved weights; showing the nearest saved step {nearest}")
        if nearest not in chosen:
            chosen.append(nearest)
    return sorted(chosen), notes


def _names_in(trial: Trial, collections: Iterable[str]) -> list[str]:
    known = trial.collections()
    names: set[str] = set()
    for collection in collections:
        if collection in known:
            names.update(trial.tensor_names(collection=collection))
    return sorted(names)


def _mode_name(trial: Trial, step: int) -> str:
    try:
        return trial.mode(step).name
    except TrialError:
        return ModeKeys.GLOBAL.name


class _StepReader:
    """Batched reads of one step: raw values in one call, saved reductions where raw is absent."""

    def __init__(self, trial: Trial) -> None:
        self.trial = trial
        self._steps: dict[str, list[int]] = {}
        # global step -> why it is left out of every chart: a corrupt or truncated record
        self.skipped: dict[int, str] = {}

    def _skip(self, step: int, error: FormatError) -> None:
        """Leave a damaged step out of the report (once, with a warning), not the whole run."""
        if step not in self.skipped:
            self.skipped[step] = str(error)
            logger.warning("trainguard: report skips step %d: %s", step, error)

    def saved_steps(self, names: Sequence[str]) -> dict[str, list[int]]:
        """Global steps of each name (raw or reductions), listed once per name per report."""
        for name in names:
            if name not in self._steps:
                self._steps[name] = self.trial.tensor(name).steps()
        return {name: self._steps[name] for name in names}

    def raw(self, names: Sequence[str], step: int) -> dict[str, np.ndarray]:
        """Raw values of ``names`` at ``step``; names saved only as reductions are left out."""
        if not names or step in self.skipped:
            return {}
        try:
            return self.trial.tensor_values(names, step)
        except (TensorUnavailable, TensorUnavailableForStep):
            pass
        except FormatError as error:
            self._skip(step, error)
            return {}
        found = {}
        for name in names:  # some name lacks a raw value here: read the others one by one
            try:
                found.update(self.trial.tensor_values([name], step))
            except (TensorUnavailable, TensorUnavailableForStep):
                continue
            except FormatError as error:
                self._skip(step, error)
                return {}
        return found

    def reduced(self, names: Sequence[str], step: int, reduction: str) -> dict[str, float]:
        """``reduction`` of each name at ``step``, from the raw value or from a saved reduction."""
        values = self.raw(names, step)
        if step in self.skipped:
            return {}
        result = {name: float(numpy_reduction(value, reduction)) for name, value in values.items() if value.size}
        for name in names:
            if name in values:
                continue
            try:
                result[name] = float(self.trial.tensor(name).reduction_value(step, reduction))
            except (TensorUnavailable, TensorUnavailableForStep):
                continue
            except FormatError as error:
                self._skip(step, error)
                return {}
        return result


def _curves(
    reader: _StepReader,
    names: Sequence[str],
    steps_of: dict[str, list[int]],
    reduction: str,
    max_points: int,
) -> dict[str, Series]:
    """One series per tensor: ``reduction`` of its value at (subsampled) global steps."""
    wanted = subsample(sorted({step for name in names for step in steps_of[name]}), max_points)
    series = {name: Series(name, [], []) for name in names}
    for step in wanted:
        present = [name for name in names if step in steps_of[name]]
        for name, value in reader.reduced(present, step, reduction).items():
            series[name].x.append(float(step))
            series[name].y.append(value)
    return {name: line for name, line in series.items() if line.x}


def _chunked_charts(title: str, y_label: str, series: Sequence[Series], *, note: str = "") -> list[Chart]:
    charts = []
    groups = [series[i : i + SERIES_PER_CHART] for i in range(0, len(series), SERIES_PER_CHART)]
    for number, group in enumerate(groups, 1):
        suffix = f" ({number}/{len(groups)})" if len(groups) > 1 else ""
        positive = [y for line in group for _, y in line.finite_points() if y > 0]
        spread = max(positive) / min(positive) if positive else 1.0
        has_non_positive = any(y <= 0 for line in group for _, y in line.finite_points())
        charts.append(
            Chart(
                title + suffix,
                "global step",
                y_label,
                list(group),
                log_y=spread > 100 and not has_non_positive,
                note=note,
            )
        )
    return charts


def _scalar_charts(trial: Trial, reader: _StepReader, names: Sequence[str], max_points: int) -> list[Chart]:
    """One chart per scalar (loss or metric), one series per mode, x = global step."""
    steps_of = reader.saved_steps(names)
    wanted = subsample(sorted({step for name in names for step in steps_of[name]}), max_points)
    by_name: dict[str, dict[str, Series]] = {name: {} for name in names}
    for step in wanted:
        present = [name for name in names if step in steps_of[name]]
        mode = _mode_name(trial, step)
        for name, value in reader.reduced(present, step, "mean").items():
            line = by_name[name].setdefault(mode, Series(mode, [], []))
            line.x.append(float(step))
            line.y.append(value)
    return [
        Chart(name, "global step", "value", [by_mode[mode] for mode in sorted(by_mode)])
        for name, by_mode in by_name.items()
        if by_mode
    ]


def _histogram_charts(
    reader: _StepReader, names: Sequence[str], steps: Sequence[int], bins: int
) -> tuple[list[Chart], list[str]]:
    """Per weight tensor, one outlined histogram per chosen step on shared bin edges."""
    values_at = {step: reader.raw(names, step) for step in steps}
    missing = {step: [name for name in names if name not in values_at[step]] for step in steps}
    if names and all(len(missing[step]) == len(names) for step in steps):
        notes = [
            f"Only reductions of the weights were saved at steps {', '.join(map(str, steps))}: histograms need raw "
            "values (ReductionConfig(save_raw_tensor=True) for the 'weights' collection)."
        ]
    else:
        notes = [
            f"step {step}: no raw values for {', '.join(names_missing[:3])}" + (" …" if len(names_missing) > 3 else "")
            for step, names_missing in missing.items()
            if names_missing
        ]
    charts = []
    for name in names:
        arrays = {step: values_at[step][name].astype(np.float64).ravel() for step in steps if name in values_at[step]}
        arrays = {step: array[np.isfinite(array)] for step, array in arrays.items()}
        arrays = {step: array for step, array in arrays.items() if array.size}
        if not arrays:
            continue
        low = min(float(array.min()) for array in arrays.values())
        high = max(float(array.max()) for array in arrays.values())
        if not math.isfinite(low) or not math.isfinite(high):
            continue
        if high <= low:
            low, high = low - 0.5, high + 0.5
        # Fewer bins for small tensors: 40 bins over 64 values would be mostly noise.
        largest = max(array.size for array in arrays.values())
        edges = np.linspace(low, high, int(min(bins, max(10, math.sqrt(largest)))) + 1)
        series = [
            Series(f"step {step}", edges.tolist(), np.histogram(array, bins=edges)[0].astype(float).tolist())
            for step, array in arrays.items()
        ]
        charts.append(Chart(f"{name} distribution", "value", "count", series, kind="histogram"))
    return charts, notes


def gather_tensor_sections(
    trial: Trial,
    *,
    histogram_steps: Sequence[int] | None = None,
    max_points: int = 200,
    max_scalar_points: int = 1000,
    bins: int = 40,
) -> TensorSections:
    """Read what the report's tensor sections show.

    Args:
        trial: the run.
        histogram_steps: global steps for the weight histograms; default first, middle and last.
        max_points: most steps read per norm or zero-fraction curve.
        max_scalar_points: most steps read per loss/metric curve (scalars are cheap).
        bins: histogram bins.
    """
    sections = TensorSections()
    reader = _StepReader(trial)

    scalars = _names_in(trial, SCALAR_COLLECTIONS)
    sections.scalar_charts = _scalar_charts(trial, reader, scalars, max_scalar_points)
    if not sections.scalar_charts:
        sections.note("scalars", "No losses or metrics were saved: include the 'losses' and 'metrics' collections.")

    for attribute, collection, title, hint in (
        ("weight_norm_charts", "weights", "Weight L2 norm per layer", "weights"),
        ("bias_norm_charts", "biases", "Bias L2 norm per layer", "biases"),
        ("gradient_norm_charts", "gradients", "Gradient L2 norm per layer", "gradients"),
    ):
        names = _names_in(trial, [collection])
        curves = _curves(reader, names, reader.saved_steps(names), "l2", max_points)
        setattr(sections, attribute, _chunked_charts(title, "L2 norm", list(curves.values())))
        if not curves:
            sections.note("norms", f"No {collection} were saved: include the {hint!r} collection.")

    weights = _names_in(trial, ["weights"])
    available = sorted({step for steps in reader.saved_steps(weights).values() for step in steps})
    sections.histogram_steps, notes = pick_histogram_steps(available, histogram_steps)
    for text in notes:
        sections.note("histograms", text)
    shown = weights[:MAX_HISTOGRAM_TENSORS]
    if len(weights) > len(shown):
        sections.note("histograms", f"showing the first {len(shown)} of {len(weights)} weight tensors")
    charts, notes = _histogram_charts(reader, shown, sections.histogram_steps, bins)
    sections.histogram_charts = charts
    for text in notes:
        sections.note("histograms", text)
    if not weights:
        sections.note("histograms", "No weights were saved: include the 'weights' collection.")

    losses = set(_names_in(trial, ["losses"]))
    activations = [name for name in _names_in(trial, ACTIVATION_COLLECTIONS) if name not in losses]
    curves = _curves(reader, activations, reader.saved_steps(activations), "zero_fraction", max_points)
    sections.activation_charts = _chunked_charts(
        "Activation zero fraction per layer",
        "fraction of zeros",
        list(curves.values()),
        note="A layer near 1.0 for many steps is a dead ReLU.",
    )
    for chart in sections.activation_charts:
        chart.log_y = False
    if not curves:
        sections.note(
            "activations", "No layer outputs were saved: include the 'relu_output' (or 'outputs') collection."
        )
    for step, why in sorted(reader.skipped.items()):
        sections.note("overview", f"Step {step} is left out of every chart: its data is damaged ({why}).")
    for key, why in trial.unreadable_files().items():
        sections.note("overview", f"{key}: {why}; its tensors are not in this report.")
    return sections
