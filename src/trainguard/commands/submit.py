"""``trainguard submit job.yaml|job.json [--api URL] [--token T] [--wait]``: send a job to the API.

Plain urllib, no service code: the client side needs nothing beyond the core package. YAML
needs PyYAML (``pip install pyyaml``); JSON always works. The token comes from ``--token`` or
TRAINGUARD_API_TOKEN, the URL from ``--api`` or TRAINGUARD_API_URL (default
http://127.0.0.1:8080). With ``--wait`` it follows the job until it ends, prints each status
and rule change, and exits 0 for Completed, 1 for Stopped/Failed or a rule with issues.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from trainguard.errors import ConfigError
from trainguard.statuses import JOB_TERMINAL, RULE_TERMINAL, JobStatus, RuleStatus

__all__ = ["register"]

def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("submit", help="submit a training job (YAML or JSON spec) to the trainguard API")
    parser.add_argument("spec", help="job spec file: .yaml/.yml (needs PyYAML) or .json")
    parser.add_argument("--api", help="API URL (default $TRAINGUARD_API_URL or http://127.0.0.1:8080)")
    parser.add_argument("--token", help="API token (default $TRAINGUARD_API_TOKEN)")
    parser.add_argument("--name", help="override the job name in the spec")
    parser.add_argument("--wait", action="store_true", help="follow the job until it ends")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds --wait waits at most (default 3600)")
    parser.set_defaults(func=_submit)


def _load_spec(path: str) -> dict[str, Any]:
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as error:
        raise ConfigError(f"cannot read job spec {path}: {error.strerror or error}") from None
    if file.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ConfigError(
                f"{path} is YAML, which needs PyYAML: pip install pyyaml (or write the spec as JSON)"
            ) from None
        try:
            spec = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise ConfigError(f"{path} is not valid YAML: {error}") from None
    else:
        try:
            spec = json.loads(text)
        except ValueError as error:
            raise ConfigError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: a job spec is a mapping (name, command, rules...), not {type(spec).__name__}")
    return spec


class _Client:
    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with self._opener.open(request, timeout=30) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            raise ConfigError(f"{method} {path}: HTTP {error.code}: {_explain(error)}") from None
        except (urllib.error.URLError, OSError) as error:
            raise ConfigError(
                f"cannot reach the trainguard API at {self.url}: {getattr(error, 'reason', error)}"
            ) from None


def _explain(error: urllib.error.HTTPError) -> str:
    raw = error.read().decode(errors="replace")
    try:
        detail = json.loads(raw).get("detail")
    except (ValueError, AttributeError):
        return raw[:500]
    if isinstance(detail, list):
        parts = []
        for item in detail:
            where = ".".join(str(part) for part in item.get("loc", [])[1:])
            parts.append(f"{where}: {str(item.get('msg', '')).removeprefix('Value error, ')}")
        return "; ".join(parts)
    return str(detail)


def _submit(args: argparse.Namespace) -> int:
    token = args.token or os.environ.get("TRAINGUARD_API_TOKEN", "")
    if not token:
        raise ConfigError("no API token: pass --token or set TRAINGUARD_API_TOKEN")
    spec = _load_spec(args.spec)
    if args.name:
        spec["name"] = args.name
    client = _Client(args.api or os.environ.get("TRAINGUARD_API_URL") or "http://127.0.0.1:8080", token)
    job = client.call("POST", "/v1/jobs", spec)
    name = job["name"]
    print(f"submitted {name}: {job['status']} ({job['secondary_status']})", flush=True)
    if not args.wait:
        return 0
    return _follow(client, name, args.timeout)


def _follow(client: _Client, name: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    seen: dict[str, str] = {}
    path = f"/v1/jobs/{urllib.parse.quote(name, safe='')}"
    while True:
        job = client.call("GET", path)
        state = f"{job['status']} ({job['secondary_status']})"
        if seen.get("job") != state:
            print(f"{name}: {state}", flush=True)
            seen["job"] = state
        for rule in job["rules"]:
            text, fix = _rule_line(rule)
            if seen.get(rule["configuration_name"]) != text:
                print(f"  rule {rule['configuration_name']}: {text}", flush=True)
                if fix:
                    print(f"    fix: {fix}", flush=True)
                seen[rule["configuration_name"]] = text
        rules_done = all(rule["status"] in RULE_TERMINAL for rule in job["rules"])
        if job["status"] in JOB_TERMINAL and rules_done:
            if job.get("failure_reason"):
                print(f"  failure: {job['failure_reason']}", flush=True)
            issues = any(rule["status"] == RuleStatus.ISSUES_FOUND for rule in job["rules"])
            return 0 if job["status"] == JobStatus.COMPLETED and not issues else 1
        if time.monotonic() > deadline:
            print(f"{name}: still {state} after {timeout:g} s; stopped waiting (the job goes on)", file=sys.stderr)
            return 2
        time.sleep(1.0)


def _rule_line(rule: dict[str, Any]) -> tuple[str, str]:
    """A rule's status as one line, and the fix to print under it. A rule with issues is shown as
    its first finding (step, worker, message), not SageMaker's generic RuleEvaluationConditionMet."""
    details = str(rule.get("status_details") or "").strip()
    if rule["status"] != "IssuesFound":
        return rule["status"] + (f": {details}" if details else ""), ""
    issues = [
        f for f in rule.get("findings") or [] if isinstance(f, dict) and f.get("fired", True) and not f.get("advice")
    ]
    if not issues:
        return rule["status"] + (f": {details}" if details else ""), str(rule.get("fix_hint") or "")
    first = min(issues, key=lambda f: int(f.get("step") or 0))
    where = f" on {first['worker']}" if first.get("worker") else ""
    text = f"IssuesFound at step {first.get('step')}{where}: {first.get('message')}"
    return text, str(first.get("fix_hint") or rule.get("fix_hint") or "")
