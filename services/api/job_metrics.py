"""SageMaker's ``FinalMetricDataList``: the job's ``MetricDefinitions`` applied to its training log.

SageMaker scans a training container's log with each definition's regex (the first group is the
value) and reports the latest value of each metric. trainguard does the same over the launcher's
log of the training component when a job is described.

The regexes are the caller's and the log is the job's: neither may cost the API more than a bound.

* The regexes run in RE2 (``google-re2``), whose matching time grows linearly with the text
  whatever the pattern. Python's backtracking ``re`` takes time exponential in the line for
  patterns such as ``(a+)+$``, inside one C call that other requests wait behind. RE2 has no
  backreferences or lookarounds: CreateTrainingJob refuses what it cannot compile
  (:func:`metric_regex_problem`), so describe never meets such a regex.
* Only the log's tail is read (:data:`MAX_LOG_LINES` lines, at most :data:`MAX_LOG_CHARS`
  characters), newest line first, and a scan stops at :data:`SCAN_BUDGET_S` with the latest values
  found so far (newest first: what it found are the latest values).
* A scan's result is kept per job and log content; a finished job's log is not read again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "MAX_LOG_CHARS",
    "MAX_LOG_LINES",
    "SCAN_BUDGET_S",
    "MetricScanner",
    "final_metric_data",
    "metric_regex_problem",
    "metric_scanner",
]

log = logging.getLogger("trainguard.api")

MAX_LOG_LINES = 20_000
MAX_LOG_CHARS = 1024 * 1024
SCAN_BUDGET_S = 0.5
_CACHED_SCANS = 1024
# RE2's default program budget: a pattern whose automaton would be larger is refused at creation.
_RE2_MAX_MEM = 8 << 20


def _re2() -> Any:
    """The ``re2`` module, or None where google-re2 is not installed (then no regex is accepted)."""
    try:
        import re2
    except ImportError:
        return None
    return re2


@functools.lru_cache(maxsize=4096)
def _compile(regex: str) -> Any:
    """The RE2 program of ``regex``; raises ValueError with RE2's reason when it has none."""
    re2 = _re2()
    if re2 is None:
        raise ValueError(
            "MetricDefinitions need the google-re2 package on the server (pip install google-re2): "
            "a caller's regex never runs in Python's backtracking engine"
        )
    options = re2.Options()
    options.log_errors = False  # a refused pattern is the caller's error, reported to the caller
    options.max_mem = _RE2_MAX_MEM
    try:
        return re2.compile(regex, options)
    except re2.error as error:
        reason = error.args[0] if error.args else error
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", errors="replace")
        raise ValueError(
            f"RE2 cannot compile it ({reason}); metric regexes run in a linear-time engine, which has no "
            "backreferences or lookarounds"
        ) from None


def metric_regex_problem(regex: str) -> str:
    """'' when ``regex`` can run as a metric definition, else why not (RE2's reason)."""
    try:
        _compile(regex)
    except ValueError as error:
        return str(error)
    return ""


def _compiled(definitions: Sequence[Any]) -> list[tuple[str, Any]]:
    compiled = []
    for definition in definitions:
        if not isinstance(definition, dict):
            continue
        name, regex = definition.get("Name"), definition.get("Regex")
        if not isinstance(name, str) or not isinstance(regex, str):
            continue
        try:
            compiled.append((name, _compile(regex)))
        except ValueError:
            continue  # CreateTrainingJob refuses such a regex; describe never fails on one
    return compiled


def _value(pattern: Any, line: str) -> float | None:
    match = pattern.search(line)
    if match is None:
        return None
    text = match.group(1) if pattern.groups else match.group(0)
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None  # SageMaker drops values that are not numbers


def final_metric_data(
    definitions: Sequence[Any], text: str, timestamp: float, *, budget_s: float = SCAN_BUDGET_S
) -> list[dict[str, Any]]:
    """``[{"MetricName", "Value", "Timestamp"}]``: the last finite value each definition matched.

    ``text`` is the log (its tail); lines are scanned newest first, until every definition has a
    value or ``budget_s`` has passed.
    """
    pending = _compiled(definitions)
    latest: dict[str, float] = {}
    deadline = time.monotonic() + budget_s
    lines = text.splitlines()
    for line in reversed(lines):
        if not pending or time.monotonic() > deadline:
            break
        remaining = []
        for name, pattern in pending:
            value = _value(pattern, line)
            if value is None:
                remaining.append((name, pattern))
            else:
                latest.setdefault(name, value)
        pending = [(name, pattern) for name, pattern in remaining if name not in latest]
    if pending and lines and time.monotonic() > deadline:
        log.info("metric scan stopped after %.1f s with %d definitions unmatched", budget_s, len(pending))
    order = [name for name, _ in _compiled(definitions)]
    return [
        {"MetricName": name, "Value": latest[name], "Timestamp": timestamp}
        for name in dict.fromkeys(order)
        if name in latest
    ]


class MetricScanner:
    """Bounded, cached ``FinalMetricDataList`` of one service's jobs."""

    def __init__(
        self, *, max_lines: int = MAX_LOG_LINES, max_chars: int = MAX_LOG_CHARS, budget_s: float = SCAN_BUDGET_S
    ) -> None:
        self._max_lines = max_lines
        self._max_chars = max_chars
        self._budget_s = budget_s
        self._lock = threading.Lock()
        self._scans: OrderedDict[tuple[str, ...], tuple[str, list[dict[str, Any]]]] = OrderedDict()

    def final_metric_data(
        self,
        job: str,
        created: Any,
        definitions: Sequence[Any],
        timestamp: float,
        *,
        finished: bool,
        read_log: Callable[[int], str],
    ) -> list[dict[str, Any]]:
        """The job's metrics; a finished job's log is scanned once, a running one's when it changed.

        ``read_log(tail_lines)`` returns the training log's last lines (e.g. a launcher's ``logs``).
        """
        key = (job, repr(created), json.dumps(definitions, sort_keys=True, default=str))
        with self._lock:
            cached = self._scans.get(key)
        if cached is not None and cached[0] == "final":
            return _stamped(cached[1], timestamp)
        try:
            text = read_log(self._max_lines)
        except Exception:  # noqa: BLE001 - a job whose components are gone keeps no log to scan
            text = ""
        text = text[-self._max_chars :]
        digest = hashlib.blake2b(text.encode("utf-8", errors="replace"), digest_size=16).hexdigest()
        if cached is not None and cached[0] == digest:
            metrics = cached[1]
        else:
            metrics = final_metric_data(definitions, text, timestamp, budget_s=self._budget_s)
        with self._lock:
            self._scans[key] = ("final" if finished else digest, metrics)
            self._scans.move_to_end(key)
            while len(self._scans) > _CACHED_SCANS:
                self._scans.popitem(last=False)
        return _stamped(metrics, timestamp)


def _stamped(metrics: list[dict[str, Any]], timestamp: float) -> list[dict[str, Any]]:
    return [{**metric, "Timestamp": timestamp} for metric in metrics]


_SCANNERS: weakref.WeakKeyDictionary[Any, MetricScanner] = weakref.WeakKeyDictionary()
_SCANNERS_LOCK = threading.Lock()


def metric_scanner(owner: Any) -> MetricScanner:
    """The scanner of ``owner`` (a job service): one per service, so describes share its cache."""
    with _SCANNERS_LOCK:
        scanner = _SCANNERS.get(owner)
        if scanner is None:
            scanner = _SCANNERS[owner] = MetricScanner()
        return scanner
