"""Where a rule runner's updates go: the control API (HTTP) and CloudWatch (put_metric_data)."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

__all__ = ["ApiReporter", "MetricsEmitter", "METRIC_NAMESPACE"]

log = logging.getLogger("trainguard.rule_runner")
METRIC_NAMESPACE = "trainguard/Rules"


class ApiReporter:
    """POSTs each StatusUpdate to ``/v1/internal/jobs/<job>/rules/<config>/status``; retried, never fatal."""

    def __init__(
        self, api_url: str, token: str, job: str, configuration: str, *, attempts: int = 4, timeout: float = 5.0
    ):
        quote = urllib.parse.quote
        self.url = (
            f"{api_url.rstrip('/')}/v1/internal/jobs/{quote(job, safe='')}/rules/{quote(configuration, safe='')}/status"
        )
        self.token = token
        self.attempts = attempts
        self.timeout = timeout
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def send(self, document: dict[str, Any]) -> bool:
        body = json.dumps(document, default=str).encode()
        for attempt in range(self.attempts):
            request = urllib.request.Request(
                self.url,
                data=body,
                method="POST",
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
            )
            try:
                with self._opener.open(request, timeout=self.timeout):
                    return True
            except urllib.error.HTTPError as error:
                if error.code < 500:
                    log.warning("the API refused the report (%s): %s", error.code, error.read()[:300])
                    return False
                reason = f"HTTP {error.code}"
            except (urllib.error.URLError, OSError) as error:
                reason = str(getattr(error, "reason", error))
            if attempt + 1 < self.attempts:
                time.sleep(0.2 * 2**attempt)
        log.warning("could not report to %s after %d attempts: %s", self.url, self.attempts, reason)
        return False


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
