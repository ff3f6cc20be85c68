"""SageMaker's ``FinalMetricDataList``: the job's ``MetricDefinitions`` applied to its training log.

SageMaker scans a training container's log with each definition's regex (the first group is the
value) and reports the latest value of each metric. trainguard does the same over the launcher's
log of the training component when a job is described.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["final_metric_data"]


def _compiled(definitions: Sequence[Any]) -> list[tuple[str, re.Pattern[str]]]:
    compiled = []
    for definition in definitions:
        if not isinstance(definition, dict):
            continue
        name, regex = definition.get("Name"), definition.get("Regex")
        if not isinstance(name, str) or not isinstance(regex, str):
            continue
        try:
            compiled.append((name, re.compile(regex)))
        except re.error:
            continue  # CreateTrainingJob validation reports a bad regex; describe never fails on one
    return compiled


def final_metric_data(definitions: Sequence[Any], lines: Iterable[str], timestamp: float) -> list[dict[str, Any]]:
    """``[{"MetricName", "Value", "Timestamp"}]``: the last finite value each definition matched."""
    compiled = _compiled(definitions)
    latest: dict[str, float] = {}
    for line in lines:
        for name, pattern in compiled:
            match = pattern.search(line)
            if match is None:
                continue
            text = match.group(1) if pattern.groups else match.group(0)
            try:
                value = float(text)
            except (TypeError, ValueError):
                continue
            if math.isfinite(value):  # SageMaker drops values that are not numbers
                latest[name] = value
    return [{"MetricName": name, "Value": value, "Timestamp": timestamp} for name, value in latest.items()]
