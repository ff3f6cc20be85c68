"""``python -m trainguard.services.rule_runner``: run one rule configuration of one job (see the package doc).

Environment: TRAINING_JOB_NAME, RULE_CONFIGURATION_NAME, RULE_TO_INVOKE, RULE_PARAMETERS_JSON,
BASE_TRIAL (required); RULE_ACTIONS_JSON, RULE_SOURCE_URI, RULE_OUTPUT_DIR, RULE_PROGRESS_FILE,
S3_ENDPOINT_URL, CLOUDWATCH_ENDPOINT_URL, AWS_REGION, TRAINGUARD_API_URL, TRAINGUARD_API_TOKEN,
RULE_POLL_INTERVAL (optional).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from trainguard.services.rule_runner.reporting import ApiReporter, MetricsEmitter

log = logging.getLogger("trainguard.rule_runner")
EXIT_CODES = {"NoIssuesFound": 0, "IssuesFound": 1, "Error": 2, "Stopped": 143, "Stopping": 143}
_REQUIRED = ("TRAINING_JOB_NAME", "RULE_CONFIGURATION_NAME", "RULE_TO_INVOKE", "BASE_TRIAL")


def _fetch_rule_source(uri: str, endpoint_url: str | None, region: str) -> Path:
    """A custom rule's .py file (s3://, file:// or a path) copied into a fresh folder."""
    folder = Path(tempfile.mkdtemp(prefix="trainguard-rule-"))
    name = Path(uri.split("?", 1)[0]).name or "custom_rule.py"
    if not name.endswith(".py"):
        name += ".py"
    target = folder / name.replace("-", "_")
    if uri.startswith("s3://"):
        import boto3

        bucket, _, key = uri[5:].partition("/")
        boto3.client("s3", endpoint_url=endpoint_url or None, region_name=region).download_file(
            bucket, key, str(target)
        )
    else:
        target.write_bytes(Path(uri.removeprefix("file://")).read_bytes())
    return target


def _parameters(environ: dict[str, str]) -> dict[str, Any]:
    raw = environ.get("RULE_PARAMETERS_JSON") or "{}"
    parameters = json.loads(raw)
    if not isinstance(parameters, dict):
        raise ValueError(f"RULE_PARAMETERS_JSON must be a JSON object, got {raw[:100]!r}")
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in parameters.items()}


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s rule-runner %(levelname)s %(message)s")
    environ = dict(os.environ)
    missing = [key for key in _REQUIRED if not environ.get(key)]
    job = environ.get("TRAINING_JOB_NAME", "")
    configuration = environ.get("RULE_CONFIGURATION_NAME", "")
    reporter = None
    if environ.get("TRAINGUARD_API_URL") and environ.get("TRAINGUARD_API_TOKEN") and job and configuration:
        reporter = ApiReporter(environ["TRAINGUARD_API_URL"], environ["TRAINGUARD_API_TOKEN"], job, configuration)

    def fail(message: str) -> int:
        log.error("%s", message)
        if reporter is not None:
            reporter.send({"configuration_name": configuration, "status": "Error", "status_details": message[:1024]})
        return EXIT_CODES["Error"]

    if missing:
        return fail(f"ConfigurationError: missing environment variable(s) {', '.join(missing)}")
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    try:
        from trainguard.rules import RuleSpec
        from trainguard.rules.runner import RuleRunner

        parameters = _parameters(environ)
        start_step = int(parameters.pop("start_step")) if "start_step" in parameters else None
        end_step = int(parameters.pop("end_step")) if "end_step" in parameters else None
        rule = environ["RULE_TO_INVOKE"]
        if environ.get("RULE_SOURCE_URI"):
            source = _fetch_rule_source(environ["RULE_SOURCE_URI"], environ.get("S3_ENDPOINT_URL"), region)
            sys.path.insert(0, str(source.parent))
            rule = f"{source.stem}:{rule.rpartition(':')[2]}"
        actions = json.loads(environ.get("RULE_ACTIONS_JSON") or "[]")
        spec = RuleSpec(rule=rule, parameters=parameters, configuration_name=configuration, actions=tuple(actions))
    except Exception as error:  # noqa: BLE001 - any set-up failure is this rule's Error status
        return fail(f"ConfigurationError: {type(error).__name__}: {error}")

    metrics = None
    if environ.get("CLOUDWATCH_ENDPOINT_URL"):
        try:
            metrics = MetricsEmitter(environ["CLOUDWATCH_ENDPOINT_URL"], region, job, configuration)
        except Exception as error:  # noqa: BLE001 - metrics are optional
            log.warning("no CloudWatch metrics: %s", error)

    stop_event = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: stop_event.set())

    datapoints: list[dict[str, Any]] = []
    lock = threading.Lock()

    # A firing step's datapoint travels with (or after) the report that carries its finding: an
    # alarm or rule action woken by the datapoint must find the finding already there.
    fired_points: list[dict[str, Any]] = []

    def evaluated(result: Any) -> None:
        """Every evaluated step: RuleIssuesFound 0/1 to CloudWatch and (batched) to the API's alarms."""
        value = 1.0 if result.fired else 0.0
        if metrics is not None:
            metrics.add("RuleIssuesFound", value, "Count")
            metrics.add("RuleLastEvaluatedStep", float(result.step))
        point = {"metric": "RuleIssuesFound", "value": value, "step": int(result.step)}
        if reporter is not None and result.fired:
            with lock:
                fired_points.append(point)
            return
        if reporter is not None:
            # Into the durable outbox now, before the progress file records the step as evaluated:
            # a runner killed after that must not lose the datapoint (the outbox batches them).
            reporter.send({"configuration_name": configuration, "datapoints": [point]})
            return
        with lock:
            datapoints.append(point)

    def send(document: dict[str, Any]) -> None:
        with lock:
            document["datapoints"] = [*document.get("datapoints", []), *datapoints, *fired_points]
            datapoints.clear()
            fired_points.clear()
        steps = [point["step"] for point in document["datapoints"]]
        if steps and document.get("last_evaluated_step") is None:
            document["last_evaluated_step"] = max(steps)  # progress is visible between findings too
        if reporter is not None:
            reporter.send(document)

    def on_update(update: Any) -> None:
        send(update.to_dict())

    def flush_datapoints() -> None:
        while not stop_flusher.wait(0.5):
            if datapoints:
                send({"configuration_name": configuration})

    stop_flusher = threading.Event()
    threading.Thread(target=flush_datapoints, daemon=True).start()

    class ReportingRunner(RuleRunner):
        def _record(self, name: str, result: Any) -> None:  # every evaluated step passes here
            # a step the rule could not evaluate is no "0 issues" datapoint
            if result is not None and not result.missing and result.not_evaluated is None:
                evaluated(result)
            super()._record(name, result)
            if fired_points:  # no report carried it (not every finding changes the status): send it now
                send({"configuration_name": configuration})

    try:
        runner = ReportingRunner(
            environ["BASE_TRIAL"],
            [spec],
            progress_file=environ.get("RULE_PROGRESS_FILE") or None,
            output_dir=environ.get("RULE_OUTPUT_DIR") or None,
            start_step=start_step,
            end_step=end_step,
            endpoint_url=environ.get("S3_ENDPOINT_URL") or None,
            poll_interval=float(environ.get("RULE_POLL_INTERVAL") or 0.5),
            on_update=on_update,
            stop_event=stop_event,
        )
        results = runner.run()
    except Exception as error:  # noqa: BLE001 - a crashed rule is an Error status, as SageMaker's
        log.exception("rule runner crashed")
        if metrics is not None:
            metrics.flush()
        return fail(f"InternalServerError: {type(error).__name__}: {error}")
    stop_flusher.set()
    if metrics is not None:
        metrics.flush()
    final = results.get(configuration) or next(iter(results.values()), None)
    status = getattr(getattr(final, "status", None), "value", getattr(final, "status", "Error"))
    if stop_event.is_set() and status not in ("IssuesFound", "Error"):
        status = "Stopped"
    if final is not None and status != "Stopped":
        send(final.to_dict())
    elif datapoints:
        send({"configuration_name": configuration})
    log.info("rule %s finished: %s", configuration, status)
    return EXIT_CODES.get(str(status), 2)


if __name__ == "__main__":
    sys.exit(main())
