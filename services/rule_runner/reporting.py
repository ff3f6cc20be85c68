"""Where a rule runner's updates go: the control API (HTTP) and CloudWatch (put_metric_data)."""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ApiReporter", "METRIC_NAMESPACE", "MetricsEmitter", "ReportOutbox"]

log = logging.getLogger("trainguard.rule_runner")
METRIC_NAMESPACE = "trainguard/Rules"


class ApiReporter:
    """Delivers each StatusUpdate to ``/v1/internal/jobs/<job>/rules/<config>/status``; never drops one.

    Every report first goes to a durable outbox (an append-only JSON-lines file, fsynced), then a
    sender thread POSTs the reports in order, retrying with backoff (0.2 s doubling to 5 s) until
    the API acknowledges (2xx) or refuses it for good (4xx, logged). A runner restarted on the same
    work directory replays what was not acknowledged. Each report carries ``outbox`` (the outbox
    file's id) and ``sequence``, so the API can ignore a report it already applied (a lost answer).
    At exit, the runner waits up to ``drain_s`` for the outbox to empty (an API restart mid-run).

    Datapoint-only reports (one per evaluated step) are held up to ``batch_s`` and sent as one POST,
    at once when a status or finding report is queued behind them or at exit: statuses and
    findings go out as they change, the per-step datapoints (and the progress they carry) every
    few seconds, so the API commits a few times a minute per rule instead of once per step.

    Configuration (read here): ``RULE_OUTBOX_DIR``, else ``<RULE_OUTPUT_DIR>/rule-outbox``, else the
    temp directory; ``RULE_REPORT_DRAIN_S`` (default 120); ``RULE_REPORT_BATCH_S`` (default 5).
    """

    def __init__(
        self,
        api_url: str,
        token: str,
        job: str,
        configuration: str,
        *,
        timeout: float = 5.0,
        outbox_dir: str | os.PathLike[str] | None = None,
        drain_s: float | None = None,
        batch_s: float | None = None,
    ):
        quote = urllib.parse.quote
        self.url = (
            f"{api_url.rstrip('/')}/v1/internal/jobs/{quote(job, safe='')}/rules/{quote(configuration, safe='')}/status"
        )
        self.token = token
        self.timeout = timeout
        self.drain_s = float(os.environ.get("RULE_REPORT_DRAIN_S") or 120.0) if drain_s is None else drain_s
        if batch_s is None:
            batch_s = float(os.environ.get("RULE_REPORT_BATCH_S") or DATAPOINT_BATCH_S)
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        directory = Path(outbox_dir or _default_outbox_dir())
        # The runner token is new for each job: a later job of the same name never replays this one's reports.
        token_id = hashlib.sha256(token.encode()).hexdigest()[:12]
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{job}--{configuration}--{token_id}")
        self.outbox = ReportOutbox(directory / f"{safe}.jsonl", self._post, batch_s=batch_s)
        atexit.register(self.close)

    def send(self, document: dict[str, Any]) -> bool:
        """Queue ``document`` durably; True once it is in the outbox (delivery follows in order)."""
        try:
            self.outbox.put(document)
        except OSError as error:  # the work dir is unusable: fall back to one direct attempt
            log.warning("outbox unusable (%s): sending the report directly", error)
            return self._post(document) == "acknowledged"
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Wait (up to ``timeout``, default ``drain_s``) until the API acknowledged every report."""
        return self.outbox.close(self.drain_s if timeout is None else timeout)

    def _post(self, document: dict[str, Any]) -> str:
        """One attempt: "acknowledged", "refused" (4xx: retrying cannot help) or "retry"."""
        request = urllib.request.Request(
            self.url,
            data=json.dumps(document, default=str).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
        )
        try:
            with self._opener.open(request, timeout=self.timeout):
                return "acknowledged"
        except urllib.error.HTTPError as error:
            if error.code < 500 and error.code not in (408, 429):
                log.warning(
                    "the API refused report %s (%s): %s", document.get("sequence"), error.code, error.read()[:300]
                )
                return "refused"
            log.info("report %s: HTTP %s; will retry", document.get("sequence"), error.code)
        except (urllib.error.URLError, OSError) as error:
            log.info("report %s: %s; will retry", document.get("sequence"), getattr(error, "reason", error))
        return "retry"


def _default_outbox_dir() -> Path:
    if os.environ.get("RULE_OUTBOX_DIR"):
        return Path(os.environ["RULE_OUTBOX_DIR"])
    if os.environ.get("RULE_OUTPUT_DIR"):
        return Path(os.environ["RULE_OUTPUT_DIR"]) / "rule-outbox"
    return Path(tempfile.gettempdir()) / "trainguard-rule-outbox"


_MAX_BATCH_POINTS = 1000
# Seconds datapoint-only reports wait to travel together (see ApiReporter).
DATAPOINT_BATCH_S = 5.0
_DATAPOINT_KEYS = {"configuration_name", "datapoints", "outbox", "sequence"}


def _datapoints_only(document: dict[str, Any]) -> bool:
    return set(document) <= _DATAPOINT_KEYS and isinstance(document.get("datapoints"), list)


class ReportOutbox:
    """Append-only file of reports (``{"sequence": n, "document": {...}}`` lines) plus the last
    acknowledged sequence (``<file>.acked``, replaced atomically); ``post`` delivers one report.
    Datapoint-only reports wait up to ``batch_s`` for company (see :class:`ApiReporter`)."""

    def __init__(self, path: Path, post: Callable[[dict[str, Any]], str], *, batch_s: float = 0.0) -> None:
        self.path = path
        self.batch_s = max(0.0, float(batch_s))
        self._acked_path = path.with_name(path.name + ".acked")
        self._post = post
        self._condition = threading.Condition()
        self._pending: list[dict[str, Any]] = []
        self._queued_at: list[float] = []  # when each pending report was put (0: replayed, send now)
        self._points_sent = False  # the first datapoints go at once: the API sees the rule's progress start
        self._closing = False
        path.parent.mkdir(parents=True, exist_ok=True)
        self.id, acked, entries = self._load()
        self._next = max((entry["sequence"] for entry in entries), default=0) + 1
        self._pending = [entry["document"] for entry in entries if entry["sequence"] > acked]
        self._queued_at = [0.0] * len(self._pending)
        if self._pending:
            log.info("outbox %s: replaying %d unacknowledged report(s)", path, len(self._pending))
        self._thread = threading.Thread(target=self._deliver, name="trainguard-report-outbox", daemon=True)
        self._thread.start()

    def _load(self) -> tuple[str, int, list[dict[str, Any]]]:
        outbox_id, entries = "", []
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line torn by a kill mid-write was never acknowledged nor replayed
            if "outbox" in entry:
                outbox_id = str(entry["outbox"])
            elif isinstance(entry.get("sequence"), int) and isinstance(entry.get("document"), dict):
                entries.append(entry)
        if not outbox_id:
            outbox_id = uuid.uuid4().hex
            self._append({"outbox": outbox_id})
        try:
            acked = int(self._acked_path.read_text().strip() or 0)
        except (OSError, ValueError):
            acked = 0
        return outbox_id, acked, entries

    def _append(self, entry: dict[str, Any]) -> None:
        # Written through to the kernel before put() returns: a kill -9 of the runner loses nothing.
        # No fsync: one per evaluated step would cost more than the step, and a host crash loses
        # the runner's progress file with it anyway.
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry, default=str, separators=(",", ":")) + "\n")

    def put(self, document: dict[str, Any]) -> None:
        with self._condition:
            document = {**document, "outbox": self.id, "sequence": self._next}
            self._append({"sequence": self._next, "document": document})
            self._next += 1
            self._pending.append(document)
            self._queued_at.append(time.monotonic())
            self._condition.notify_all()

    def pending(self) -> int:
        with self._condition:
            return len(self._pending)

    def _deliver(self) -> None:
        delay = 0.2
        while True:
            with self._condition:
                while True:
                    if not self._pending and not self._closing:
                        self._condition.wait()
                        continue
                    if not self._pending:
                        return
                    held = self._hold_for()
                    if held <= 0:
                        break
                    self._condition.wait(held)
                document, merged = self._next_batch()
            outcome = self._post(document)
            if outcome == "retry":
                with self._condition:
                    self._condition.wait(delay)  # close() does not cut the backoff short: it waits
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.2
            with self._condition:
                self._points_sent = self._points_sent or _datapoints_only(self._pending[0])
                del self._pending[:merged]
                del self._queued_at[:merged]
                self._write_acked(document["sequence"])
                self._condition.notify_all()

    def _hold_for(self) -> float:
        """Seconds the pending reports may still wait (0: send now). Only datapoint-only reports
        wait, up to ``batch_s`` after the oldest was put; the outbox's first datapoints, a status
        or finding behind them, a full batch or close() send them at once. Called with the
        condition held."""
        if self.batch_s <= 0 or self._closing or not self._points_sent:
            return 0.0
        points = 0
        for document in self._pending:
            if not _datapoints_only(document):
                return 0.0
            points += len(document["datapoints"])
        if points >= _MAX_BATCH_POINTS:
            return 0.0
        return self._queued_at[0] + self.batch_s - time.monotonic()

    def _next_batch(self) -> tuple[dict[str, Any], int]:
        """The first pending report, merged with the datapoint-only reports right after it.

        One POST then carries many steps' datapoints under the last merged sequence number; the
        API applies a sequence once, and reports arrive in order, so a replay is still ignored.
        """
        first = self._pending[0]
        if not _datapoints_only(first):
            return first, 1
        points, count = list(first["datapoints"]), 1
        for document in self._pending[1:]:
            if not _datapoints_only(document) or len(points) + len(document["datapoints"]) > _MAX_BATCH_POINTS:
                break
            points.extend(document["datapoints"])
            count += 1
        last = self._pending[count - 1]
        batch = {**first, "datapoints": points, "sequence": last["sequence"]}
        steps = [point["step"] for point in points if isinstance(point.get("step"), int)]
        if steps:
            batch["last_evaluated_step"] = max(steps)  # progress is visible between findings too
        return batch, count

    def _write_acked(self, sequence: int) -> None:
        temporary = self._acked_path.with_name(self._acked_path.name + ".tmp")
        try:
            temporary.write_text(f"{sequence}\n")
            os.replace(temporary, self._acked_path)
        except OSError as error:  # replays later are harmless: the API ignores what it applied
            log.warning("could not record report %s as acknowledged: %s", sequence, error)

    def close(self, timeout: float) -> bool:
        """Deliver what is pending, for up to ``timeout`` seconds; True when nothing is left."""
        deadline = time.monotonic() + timeout
        with self._condition:
            self._closing = True
            self._condition.notify_all()
            while self._pending and time.monotonic() < deadline:
                self._condition.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            left = len(self._pending)
        if left:
            log.warning(
                "%d report(s) not acknowledged by the API yet; kept in %s for a restarted runner", left, self.path
            )
        return left == 0


class MetricsEmitter:
    """Buffers datapoints and sends them with boto3 ``put_metric_data`` (at most 20 per call)."""

    def __init__(self, endpoint_url: str, region: str, job: str, configuration: str, *, flush_seconds: float = 1.0):
        import boto3

        self.client = boto3.client("cloudwatch", endpoint_url=endpoint_url or None, region_name=region)
        self.dimensions = [
            {"Name": "TrainingJobName", "Value": job},
            {"Name": "RuleConfigurationName", "Value": configuration},
        ]
        self.flush_seconds = flush_seconds
        self._buffer: list[dict[str, Any]] = []
        self._last_flush = time.monotonic()

    def add(self, name: str, value: float, unit: str = "None") -> None:
        self._buffer.append(
            {
                "MetricName": name,
                "Dimensions": self.dimensions,
                "Value": float(value),
                "Unit": unit,
                "Timestamp": time.time(),
            }
        )
        if len(self._buffer) >= 20 or time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        while self._buffer:
            batch, self._buffer = self._buffer[:20], self._buffer[20:]
            try:
                self.client.put_metric_data(Namespace=METRIC_NAMESPACE, MetricData=batch)
            except Exception as error:  # noqa: BLE001 - metrics are best effort; the API has the statuses
                log.warning("put_metric_data failed: %s", error)
        self._last_flush = time.monotonic()
