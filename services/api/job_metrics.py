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
  characters). It is scanned in blocks of at most :data:`BLOCK_CHARS` characters (cut at line
  breaks; a longer line is scanned in pieces of that size), newest block first, so one search is
  bounded by a block. Each definition has an equal share of what is left of :data:`SCAN_BUDGET_S`
  and the whole scan stops at it, with the latest values found so far.
* Each line is its own text, as SageMaker matches a log line by line: ``^``/``$`` match at line
  ends and nothing matches across a line break (RE2's ``never_nl``).
* A scan's result is kept per job and log content; a finished job's log is not read again.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
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
    "BLOCK_CHARS",
    "MAX_LOG_CHARS",
    "MAX_LOG_LINES",
    "REFRESH_S",
    "SCAN_BUDGET_S",
    "MetricScanner",
    "final_metric_data",
    "metric_regex_problem",
    "metric_scanner",
]

log = logging.getLogger("trainguard.api")

MAX_LOG_LINES = 20_000
MAX_LOG_CHARS = 1024 * 1024
BLOCK_CHARS = 64 * 1024
# A block where a definition matches is searched again in pieces of about this size, newest first,
# for its latest value: walking every match of a block costs far more than one search does.
_PIECE_CHARS = 4 * 1024
SCAN_BUDGET_S = 0.25
# A running job's metrics are read again at most this often (clients poll describe every second or so).
REFRESH_S = 2.0
_CACHED_SCANS = 1024
# RE2's default program budget: a pattern whose automaton would be larger is refused at creation.
_RE2_MAX_MEM = 8 << 20


def _re2() -> Any:
    """The ``re2`` module, or None where google-re2 is not installed (then no regex is accepted)."""
    try:
        return importlib.import_module("re2")  # google-re2 ships no type information: used untyped
    except ImportError:
        return None


@functools.lru_cache(maxsize=4096)
def _compile(regex: str) -> Any:
    """The RE2 program of ``regex`` over a block of lines; ValueError with RE2's reason when it has none."""
    re2 = _re2()
    if re2 is None:
        raise ValueError(
            "MetricDefinitions need the google-re2 package on the server (pip install google-re2): "
            "a caller's regex never runs in Python's backtracking engine"
        )
    options = re2.Options()
    options.log_errors = False  # a refused pattern is the caller's error, reported to the caller
    options.max_mem = _RE2_MAX_MEM
    options.never_nl = True  # never across a line break: a block of lines is matched line by line
    try:
        re2.compile(regex, options)  # what the caller wrote, so that RE2's reason quotes it as written
        return re2.compile("(?m)" + regex, options)  # ^ and $ at each line's ends
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


def _number(match: Any, pattern: Any) -> float | None:
    text = match.group(1) if pattern.groups else match.group(0)
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None  # SageMaker drops values that are not numbers


def _blocks_newest_first(text: str, size: int = BLOCK_CHARS, *, whole_lines: bool = False) -> list[str]:
    """``text`` in pieces of about ``size`` characters, cut after a line break where there is one.

    A line longer than ``size`` is cut into pieces, unless ``whole_lines``: then it is one piece.
    """
    blocks = []
    end = len(text)
    while end > 0:
        start = max(0, end - size)
        if start > 0:
            newline = text.find("\n", start, end - 1)
            if newline >= 0:  # a line break inside the piece (not its last character): cut after it
                start = newline + 1
            elif whole_lines:
                start = text.rfind("\n", 0, start) + 1  # back to the start of the line (0 if none)
        blocks.append(text[start:end])
        end = start
    return blocks


def _latest_in_block(pattern: Any, block: str, deadline: float) -> float | None:
    """The last finite value ``pattern`` finds in ``block`` (None: none, or out of time first)."""
    if pattern.search(block) is None:
        return None
    for piece in _blocks_newest_first(block, _PIECE_CHARS, whole_lines=True):
        value = None
        for match in pattern.finditer(piece):  # the piece's last finite value is the latest
            number = _number(match, pattern)
            if number is not None:
                value = number
            if time.monotonic() > deadline:
                return value
        if value is not None or time.monotonic() > deadline:
            return value
    return None


def final_metric_data(
    definitions: Sequence[Any], text: str, timestamp: float, *, budget_s: float = SCAN_BUDGET_S
) -> list[dict[str, Any]]:
    """``[{"MetricName", "Value", "Timestamp"}]``: the last finite value each definition matched.

    ``text`` is the log (its tail). Each definition searches the blocks newest first and stops at
    the first block where it has a value, or when its share of what is left of ``budget_s`` is spent.
    """
    compiled = _compiled(definitions)
    blocks = _blocks_newest_first(text.replace("\r\n", "\n").replace("\r", "\n"))
    latest: dict[str, float] = {}
    overall = time.monotonic() + budget_s
    cut: list[str] = []
    for position, (name, pattern) in enumerate(compiled):
        if name in latest:
            continue
        # An equal share of what is left: time a quick definition did not use goes to the next ones.
        now = time.monotonic()
        deadline = now + max(0.0, overall - now) / (len(compiled) - position)
        value = None
        for block in blocks:
            value = _latest_in_block(pattern, block, deadline)
            if value is not None or time.monotonic() > deadline:
                break
        if value is not None:
            latest[name] = value
        elif time.monotonic() > deadline:
            cut.append(name)
    if cut:
        log.info("metric scan: %d definitions ran out of their time before a value (%s)", len(cut), ", ".join(cut[:5]))
    return [
        {"MetricName": name, "Value": latest[name], "Timestamp": timestamp}
        for name in dict.fromkeys(name for name, _ in compiled)
        if name in latest
    ]


class MetricScanner:
    """Bounded, cached ``FinalMetricDataList`` of one service's jobs."""

    def __init__(
        self,
        *,
        max_lines: int = MAX_LOG_LINES,
        max_chars: int = MAX_LOG_CHARS,
        budget_s: float = SCAN_BUDGET_S,
        refresh_s: float = REFRESH_S,
    ) -> None:
        self._max_lines = max_lines
        self._max_chars = max_chars
        self._budget_s = budget_s
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        # key -> ("final" or the log's digest, metrics, when the log was read)
        self._scans: OrderedDict[tuple[str, ...], tuple[str, list[dict[str, Any]], float]] = OrderedDict()

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
        """The job's metrics; a finished job's log is scanned once, a running one's when it changed
        (read again after ``refresh_s``).

        ``read_log(tail_lines)`` returns the training log's last lines (e.g. a launcher's ``logs``).
        """
        key = (job, repr(created), json.dumps(definitions, sort_keys=True, default=str))
        with self._lock:
            cached = self._scans.get(key)
        if cached is not None and (cached[0] == "final" or time.monotonic() - cached[2] < self._refresh_s):
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
            self._scans[key] = ("final" if finished else digest, metrics, time.monotonic())
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
