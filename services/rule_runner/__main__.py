"""``python -m trainguard.services.rule_runner``: run one rule configuration of one job (see the
package doc), or, with TRAINGUARD_RULE_GROUP_JSON, every rule configuration of one job in this one
process (how the Ray launcher runs a job's rules: one Ray job, one interpreter, one read of each
step shared by the rules).

Environment of one rule: TRAINING_JOB_NAME, RULE_CONFIGURATION_NAME, RULE_TO_INVOKE,
RULE_PARAMETERS_JSON, BASE_TRIAL (required); RULE_ACTIONS_JSON, RULE_SOURCE_URI, RULE_OUTPUT_DIR,
RULE_PROGRESS_FILE, S3_ENDPOINT_URL, CLOUDWATCH_ENDPOINT_URL, AWS_REGION, TRAINGUARD_API_URL,
TRAINGUARD_API_TOKEN, RULE_POLL_INTERVAL (optional).

A group: TRAINGUARD_RULE_GROUP_JSON is a JSON list of ``{"role": "rule:<name>", "environment":
{...}}``, each environment one rule's as above (over this process's own environment). Each rule
reports its own statuses and datapoints to the API, under its own outbox, as a runner of its own
would. Rules that read the same run over the same step range share one RuleRunner (one trial, one
read of each step); their progress is saved in ``rules-group-<key>.json`` beside the first rule's
RULE_PROGRESS_FILE, so a restarted group resumes every rule. At the end the group prints one line
per rule, ``trainguard rule group: <role> exit <code>`` (the code a runner of its own would have
exited with: how the launcher tells each rule's end apart), and exits with the worst of them.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
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
GROUP_ENV = "TRAINGUARD_RULE_GROUP_JSON"
EXIT_LINE_PREFIX = "trainguard rule group: "


def exit_line(role: str, code: int) -> str:
    """The line a group prints for each rule at its end (parsed by the Ray launcher)."""
    return f"{EXIT_LINE_PREFIX}{role} exit {code}"


def _fetch_rule_source(uri: str, endpoint_url: str | None, region: str) -> Path:
    """A custom rule's .py file (s3://, file:// or a path) copied into a fresh folder."""
    folder = Path(tempfile.mkdtemp(prefix="trainguard-rule-"))
    # The rule is imported from it for the runner's whole life: removed when the runner exits.
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
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


class _Rule:
    """One rule configuration of the process: its spec, where its reports go, and the datapoints
    not sent yet. ``code`` is set once it ended (before the run when its set-up failed)."""

    def __init__(self, environ: dict[str, str], role: str | None = None) -> None:
        self.environ = environ
        self.job = environ.get("TRAINING_JOB_NAME", "")
        self.configuration = environ.get("RULE_CONFIGURATION_NAME", "")
        self.role = role or f"rule:{self.configuration}"
        self.region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self.reporter: ApiReporter | None = None
        api = environ.get("TRAINGUARD_API_URL") and environ.get("TRAINGUARD_API_TOKEN")
        if api and self.job and self.configuration:
            self.reporter = ApiReporter(
                environ["TRAINGUARD_API_URL"], environ["TRAINGUARD_API_TOKEN"], self.job, self.configuration
            )
        self.metrics: MetricsEmitter | None = None
        self.spec: Any = None
        self.start_step: int | None = None
        self.end_step: int | None = None
        self.code: int | None = None
        self.lock = threading.Lock()
        self.datapoints: list[dict[str, Any]] = []
        # A firing step's datapoint travels with (or after) the report that carries its finding: an
        # alarm or rule action woken by the datapoint must find the finding already there.
        self.fired_points: list[dict[str, Any]] = []

    def fail(self, message: str) -> int:
        log.error("%s: %s", self.configuration or "rule", message)
        if self.reporter is not None:
            self.reporter.send({"configuration_name": self.configuration, "status": "Error",
                                "status_details": message[:1024]})  # fmt: skip
        self.code = EXIT_CODES["Error"]
        return self.code

    def set_up(self) -> bool:
        """Build the RuleSpec (and metrics); False (with the Error reported) when it cannot be."""
        environ = self.environ
        missing = [key for key in _REQUIRED if not environ.get(key)]
        if missing:
            self.fail(f"ConfigurationError: missing environment variable(s) {', '.join(missing)}")
            return False
        try:
            from trainguard.rules import RuleSpec
            from trainguard.rules.runner import validate_specs

            parameters = _parameters(environ)
            self.start_step = int(parameters.pop("start_step")) if "start_step" in parameters else None
            self.end_step = int(parameters.pop("end_step")) if "end_step" in parameters else None
            rule = environ["RULE_TO_INVOKE"]
            if environ.get("RULE_SOURCE_URI"):
                source = _fetch_rule_source(environ["RULE_SOURCE_URI"], environ.get("S3_ENDPOINT_URL"), self.region)
                sys.path.insert(0, str(source.parent))
                rule = f"{source.stem}:{rule.rpartition(':')[2]}"
            actions = json.loads(environ.get("RULE_ACTIONS_JSON") or "[]")
            self.spec = RuleSpec(
                rule=rule, parameters=parameters, configuration_name=self.configuration, actions=tuple(actions)
            )
            # Alone, as its own runner would: one bad rule of a group must not stop the others.
            validate_specs([self.spec])
        except Exception as error:  # noqa: BLE001 - any set-up failure is this rule's Error status
            self.fail(f"ConfigurationError: {type(error).__name__}: {error}")
            return False
        if environ.get("CLOUDWATCH_ENDPOINT_URL"):
            try:
                self.metrics = MetricsEmitter(environ["CLOUDWATCH_ENDPOINT_URL"], self.region, self.job,
                                              self.configuration)  # fmt: skip
            except Exception as error:  # noqa: BLE001 - metrics are optional
                log.warning("no CloudWatch metrics: %s", error)
        return True

    def evaluated(self, result: Any) -> None:
        """Every evaluated step: RuleIssuesFound 0/1 to CloudWatch and (batched) to the API's alarms.

        Advice (a property of the data or the initialisation) is no issue: it raises no alarm."""
        value = 1.0 if result.fired and not getattr(result, "advice", False) else 0.0
        if self.metrics is not None:
            self.metrics.add("RuleIssuesFound", value, "Count")
            self.metrics.add("RuleLastEvaluatedStep", float(result.step))
        point = {"metric": "RuleIssuesFound", "value": value, "step": int(result.step)}
        if self.reporter is not None and result.fired:
            with self.lock:
                self.fired_points.append(point)
            return
        if self.reporter is not None:
            # Into the durable outbox now, before the progress file records the step as evaluated:
            # a runner killed after that must not lose the datapoint (the outbox batches them).
            self.reporter.send({"configuration_name": self.configuration, "datapoints": [point]})
            return
        with self.lock:
            self.datapoints.append(point)

    def send(self, document: dict[str, Any]) -> None:
        with self.lock:
            document["datapoints"] = [*document.get("datapoints", []), *self.datapoints, *self.fired_points]
            self.datapoints.clear()
            self.fired_points.clear()
        steps = [point["step"] for point in document["datapoints"]]
        if steps and document.get("last_evaluated_step") is None:
            document["last_evaluated_step"] = max(steps)  # progress is visible between findings too
        if self.reporter is not None:
            self.reporter.send(document)

    def finish(self, final: Any, stopped: bool) -> int:
        """Send the rule's final status; the exit code a runner of its own would end with."""
        if self.metrics is not None:
            self.metrics.flush()
        status = getattr(getattr(final, "status", None), "value", getattr(final, "status", "Error"))
        if stopped and status not in ("IssuesFound", "Error"):
            status = "Stopped"
        if final is not None and status != "Stopped":
            self.send(final.to_dict())
        elif self.datapoints:
            self.send({"configuration_name": self.configuration})
        log.info("rule %s finished: %s", self.configuration, status)
        self.code = EXIT_CODES.get(str(status), 2)
        return self.code


def _partitions(rules: list[_Rule], grouped: bool) -> list[tuple[dict[str, Any], list[_Rule]]]:
    """Rules that can share one RuleRunner (same run, endpoint, output, step range, poll interval):
    the runner's options and its rules, in a stable order."""
    found: dict[str, tuple[dict[str, Any], list[_Rule]]] = {}
    for rule in rules:
        environ = rule.environ
        options = {
            "trial_path": environ["BASE_TRIAL"],
            "output_dir": environ.get("RULE_OUTPUT_DIR") or None,
            "start_step": rule.start_step,
            "end_step": rule.end_step,
            "endpoint_url": environ.get("S3_ENDPOINT_URL") or None,
            "poll_interval": float(environ.get("RULE_POLL_INTERVAL") or 0.5),
        }
        key = json.dumps(options, sort_keys=True)
        if key not in found:
            progress = environ.get("RULE_PROGRESS_FILE") or None
            if progress and grouped:
                # One file for the rules this runner evaluates, named by what they share, so the
                # same group restarted finds it again.
                digest = hashlib.sha256(key.encode()).hexdigest()[:10]
                progress = str(Path(progress).parent / f"rules-group-{digest}.json")
            found[key] = ({**options, "progress_file": progress}, [])
        found[key][1].append(rule)
    return list(found.values())


def _run_partition(options: dict[str, Any], rules: list[_Rule], stop_event: threading.Event) -> dict[str, Any]:
    """Evaluate ``rules`` with one RuleRunner; each rule's final StatusUpdate by configuration name.
    A crash of the runner is every one of these rules' Error status."""
    from trainguard.rules.runner import RuleRunner

    by_name = {rule.configuration: rule for rule in rules}

    class ReportingRunner(RuleRunner):
        def _record(self, name: str, result: Any) -> None:  # every evaluated step passes here
            rule = by_name[name]
            # a step the rule could not evaluate is no "0 issues" datapoint
            if result is not None and not result.missing and result.not_evaluated is None:
                rule.evaluated(result)
            super()._record(name, result)
            if rule.fired_points:  # no report carried it (not every finding changes the status): send it now
                rule.send({"configuration_name": rule.configuration})

    try:
        runner = ReportingRunner(
            specs=[rule.spec for rule in rules],
            on_update=lambda update: by_name[update.configuration_name].send(update.to_dict()),
            stop_event=stop_event,
            **options,
        )
        return runner.run()
    except Exception as error:  # noqa: BLE001 - a crashed rule is an Error status, as SageMaker's
        log.exception("rule runner crashed")
        for rule in rules:
            if rule.metrics is not None:
                rule.metrics.flush()
            rule.fail(f"InternalServerError: {type(error).__name__}: {error}")
        return {}


def _group_entries(environ: dict[str, str]) -> list[tuple[str | None, dict[str, str]]]:
    """(role, environment) of each rule this process runs: the group's, or this process's one."""
    raw = environ.get(GROUP_ENV)
    if not raw:
        return [(None, environ)]
    entries = json.loads(raw)
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{GROUP_ENV} must be a non-empty JSON list of {{role, environment}}")
    return [(str(entry["role"]), {**environ, **{k: str(v) for k, v in entry["environment"].items()}})
            for entry in entries]  # fmt: skip


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s rule-runner %(levelname)s %(message)s")
    environ = dict(os.environ)
    try:
        entries = _group_entries(environ)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        log.error("%s is unusable: %s", GROUP_ENV, error)
        return EXIT_CODES["Error"]
    grouped = GROUP_ENV in environ
    rules = [_Rule(rule_environ, role) for role, rule_environ in entries]
    ready = [rule for rule in rules if rule.set_up()]

    stop_event = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: stop_event.set())

    def flush_datapoints() -> None:  # only rules without a reporter collect datapoints here
        while not stop_flusher.wait(0.5):
            for rule in ready:
                if rule.datapoints:
                    rule.send({"configuration_name": rule.configuration})

    stop_flusher = threading.Event()
    threading.Thread(target=flush_datapoints, daemon=True).start()

    results: dict[str, Any] = {}
    partitions = _partitions(ready, grouped)
    threads = []
    for options, members in partitions[1:]:  # usually none: every rule of a job reads the same run
        thread = threading.Thread(
            target=lambda o=options, m=members: results.update(_run_partition(o, m, stop_event)), daemon=True
        )
        thread.start()
        threads.append(thread)
    if partitions:
        results.update(_run_partition(*partitions[0], stop_event))
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)
    stop_flusher.set()
    for rule in ready:
        if rule.code is None:  # not ended by a crash of its runner
            final = results.get(rule.configuration)
            if final is None and not grouped:
                final = next(iter(results.values()), None)
            rule.finish(final, stop_event.is_set())
    codes = [rule.code if rule.code is not None else EXIT_CODES["Error"] for rule in rules]
    if not grouped:
        return codes[0]
    for rule, code in zip(rules, codes, strict=True):
        print(exit_line(rule.role, code), flush=True)
    if all(code == 0 for code in codes):
        return 0
    return 2 if 2 in codes else 1 if 1 in codes else max(codes)


if __name__ == "__main__":
    sys.exit(main())
