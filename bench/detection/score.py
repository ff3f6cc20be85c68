"""Run the corpus and score the rules' verdicts.

Every case is trained once into ``<cache>/<name>-<spec hash>/run`` (reused while its spec is
unchanged) and then judged by ``trainguard rules run --json`` exactly as a user would run it, twice:
with the default rule set and with every debugger rule at its default parameters. The rules are
re-run on every scoring (they change; the captured runs do not).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.detection.harness import METRICS_FILE
from bench.detection.registry import Case, verify

# Rules that cannot judge one run with their defaults alone (they compare runs, need user
# thresholds, or watch wall-clock time); the fault suite leaves out the same ones.
NOT_RUN = {
    "SimilarAcrossRuns": "compares with other runs (needs other_trials)",
    "StalledTrainingRule": "wall-clock rule",
    "TensorVariance": "needs user thresholds",
}


def debugger_rules() -> list[str]:
    from trainguard.rules import builtin_rules

    return sorted(
        name
        for name, rule in builtin_rules().items()
        if getattr(rule, "kind", "debugger") == "debugger" and name not in NOT_RUN
    )


def default_rules() -> list[str]:
    from trainguard.rules.defaults import default_rule_specs

    return [spec.rule for spec in default_rule_specs()]


@dataclass
class Finding:
    rule: str
    step: int
    message: str
    certain: bool = False
    worker: str | None = None
    fix_hint: str = ""
    advice: bool = False  # a property of the data or the initialisation (trainguard.rules.advice)
    promoted: bool = False  # advice the diagnosis made a finding (the run shows a learning symptom)


@dataclass
class Verdict:
    """What one ``rules run`` said about one run.

    ``findings`` are issues: a rule's first non-advice finding, or its advice once the CLI's
    diagnosis promoted it (the run shows a learning symptom). ``advice`` holds each rule's first
    advice finding that stayed advice: it raises no alarm and is counted apart."""

    findings: dict[str, Finding] = field(default_factory=dict)  # first finding per rule
    advice: dict[str, Finding] = field(default_factory=dict)  # first advice per rule, not promoted
    possible_causes: list[dict[str, Any]] = field(default_factory=list)
    statuses: dict[str, str] = field(default_factory=dict)
    not_evaluated: dict[str, str] = field(default_factory=dict)
    primary: list[dict[str, Any]] = field(default_factory=list)
    consequences: list[dict[str, Any]] = field(default_factory=list)
    other: list[dict[str, Any]] = field(default_factory=list)
    diagnosis_from_cli: bool = False
    exit_code: int = 0
    error: str = ""


# What decides a capture besides the case's own spec: the hook code and the collection/save
# configuration. A change there (a new collection, a sentinel, another save schedule) must
# re-capture, or the rules would be judged on what an older hook wrote.
CAPTURE_SOURCES = ("hooks", "config", "pytorch.py", "keras.py", "xgboost.py", "modes.py")


# Re-judging rule changes on the captures an earlier hook made (``--capture-hash``): the hook's
# sources moved on, but the rules are what changed. Said in every result (CaseResult.capture).
CAPTURE_HASH_VARIABLE = "TRAINGUARD_DETECTION_CAPTURE_HASH"


@functools.lru_cache(maxsize=1)
def capture_source_hash() -> str:
    """A hash of the trainguard sources that decide what a run captures (see ``CAPTURE_SOURCES``),
    or the one ``TRAINGUARD_DETECTION_CAPTURE_HASH`` names (captures of that hook, reused)."""
    chosen = os.environ.get(CAPTURE_HASH_VARIABLE)
    if chosen:
        return chosen
    import trainguard

    root = Path(trainguard.__file__).parent
    digest = hashlib.sha1()
    for name in CAPTURE_SOURCES:
        path = root / name
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.exists() else []
        for file in files:
            digest.update(file.relative_to(root).as_posix().encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:10]


@functools.lru_cache(maxsize=None)
def _builder_source_hash(module: str) -> str:
    """The builder's own module: a program edited under the same spec is trained again."""
    import importlib

    path = getattr(importlib.import_module(module), "__file__", None)
    return hashlib.sha1(Path(path).read_bytes()).hexdigest()[:10] if path else ""


def spec_key(case: Case) -> str:
    text = json.dumps(
        {"builder": case.builder.__qualname__, "spec": asdict(case.spec), "capture": capture_source_hash(),
         "program": _builder_source_hash(case.builder.__module__)},
        sort_keys=True,
    )  # fmt: skip
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def ensure_run(case: Case, cache: Path) -> tuple[Path, dict[str, Any], float]:
    """The captured run of ``case`` (trained now unless cached) and its metrics."""
    directory = cache / f"{case.name}-{spec_key(case)}"
    run = directory / "run"
    metrics_path = run / METRICS_FILE
    started = time.perf_counter()
    if not metrics_path.exists():
        if os.environ.get(CAPTURE_HASH_VARIABLE):  # another hook's capture: never train it with this one
            raise FileNotFoundError(f"{case.name} has no capture under {CAPTURE_HASH_VARIABLE}")
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        case.builder(os.fspath(run), case.spec)
    seconds = time.perf_counter() - started
    return run, json.loads(metrics_path.read_text(encoding="utf-8")), seconds


def run_rules(run: Path, rules: list[str], output_dir: Path) -> Verdict:
    """``trainguard rules run RUN --rule ... --json`` in a subprocess, parsed."""
    return parse_output(*_rules_run(run, rules, output_dir))


def _rules_run(run: Path, rules: list[str], output_dir: Path) -> tuple[str, int, str]:
    if output_dir.exists():
        shutil.rmtree(output_dir)
    command = [sys.executable, "-m", "trainguard.cli", "rules", "run", os.fspath(run), "--json"]
    command += ["--output-dir", os.fspath(output_dir), "--wait-timeout", "10", "--poll-interval", "0.05"]
    for rule in rules:
        command += ["--rule", rule]
    environment = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    process = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
    return process.stdout, process.returncode, process.stderr


def subset_verdict(stdout: str, output_dir: Path, rules: list[str], exit_code: int = 0) -> Verdict:
    """What ``rules run`` with only ``rules`` says, from a run of more rules: their StatusUpdate
    lines and the CLI's own diagnosis (:func:`trainguard.rules.diagnosis.diagnose`) over their
    rule-output files. Each rule judges the run on its own, so only the ranking of findings
    depends on which rules ran, and that is recomputed here; it halves the scoring time."""
    from trainguard.rules.diagnosis import diagnose

    wanted = set(rules)
    lines = []
    for line in stdout.splitlines():
        try:
            document = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(document, dict) and (document.get("configuration_name") or document.get("rule")) in wanted:
            lines.append(line)
    results = []
    for rule in rules:
        path = output_dir / "rule-output" / f"{rule}.json"
        if path.exists():
            results.append(json.loads(path.read_text(encoding="utf-8")))
    lines.append(json.dumps({"diagnosis": diagnose(results)}, default=str))
    return parse_output("\n".join(lines), exit_code)


def parse_output(stdout: str, exit_code: int = 0, stderr: str = "") -> Verdict:
    verdict = Verdict(exit_code=exit_code)
    promoted_rules: set[Any] = set()
    failed: dict[str, str] = {}  # rule -> details, for rules that ended in error (not "not evaluated")
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            document = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "diagnosis" in document and isinstance(document["diagnosis"], dict):
            diagnosis = document["diagnosis"]
            verdict.diagnosis_from_cli = True
            verdict.primary = list(diagnosis.get("primary") or [])
            verdict.consequences = list(diagnosis.get("consequences") or [])
            verdict.other = list(diagnosis.get("other") or [])
            verdict.possible_causes = list(diagnosis.get("possible_causes") or [])
            promoted_rules = {item.get("rule") for item in verdict.possible_causes + verdict.other if item.get("promoted")}
            for item in diagnosis.get("not_evaluated") or []:
                name = item.get("rule", "?") if isinstance(item, dict) else str(item)
                verdict.not_evaluated.setdefault(name, str(item.get("message", "") if isinstance(item, dict) else ""))
            continue
        name = document.get("configuration_name") or document.get("rule")
        if not name:
            continue
        status = document.get("status", "")
        verdict.statuses[name] = status
        details = document.get("status_details") or ""
        if "RuleNotEvaluated" in details:
            verdict.not_evaluated[name] = details
        elif status == "Error":
            failed[name] = details  # judged by the rule's last status below
        result = document.get("result") or {}
        if result.get("not_evaluated"):
            verdict.not_evaluated.setdefault(name, str(result["not_evaluated"]))
        advice = bool(result.get("advice"))
        kept = verdict.advice if advice else verdict.findings
        if result.get("fired") and name not in kept:
            kept[name] = Finding(
                rule=document.get("rule") or name,
                step=int(result.get("step", document.get("step", 0)) or 0),
                message=str(result.get("message", "")),
                certain=bool(result.get("certain")),
                worker=result.get("worker"),
                fix_hint=str(result.get("fix_hint") or ""),
                advice=advice,
            )
    for name in [name for name in verdict.advice if name in promoted_rules]:  # advice made a finding
        finding = verdict.advice.pop(name)
        finding.promoted = True
        if name not in verdict.findings or verdict.findings[name].step > finding.step:
            verdict.findings[name] = finding
    if not verdict.statuses and not verdict.diagnosis_from_cli:
        verdict.error = (stderr or stdout).strip()[-600:] or f"no output (exit {exit_code})"
    elif verdict.statuses and all(status == "Error" and name in failed for name, status in verdict.statuses.items()):
        # no rule judged anything (the run could not be opened: nothing was captured): silence
        # here is no verdict, and a healthy run must not be counted silent for it
        name = sorted(failed)[0]
        verdict.error = f"every rule ended in error, e.g. {name}: {failed[name].strip()[:400]}"
    if not verdict.diagnosis_from_cli:
        _fallback_diagnosis(verdict)
    return verdict


def _fallback_diagnosis(verdict: Verdict) -> None:
    """Until the CLI prints its diagnosis: the earliest finding is primary (certain first on a
    tie), every other finding counts as a consequence (the worst case for 'findings per run')."""
    ordered = sorted(verdict.findings.values(), key=lambda f: (f.step, not f.certain, f.rule))
    as_dicts = [asdict(finding) for finding in ordered]
    verdict.primary, verdict.consequences = as_dicts[:1], as_dicts[1:]


@dataclass
class CaseResult:
    name: str
    family: str
    label: str
    split: str
    expected: tuple[str, ...]
    onset: int
    save_interval: int
    description: str
    symptom_ok: bool
    symptom_seen: str
    train_seconds: float
    rules_seconds: float
    verdicts: dict[str, Verdict]  # "default" | "all"
    error: str = ""


def score_case(case: Case, cache: Path, rule_sets: dict[str, list[str]]) -> CaseResult:
    try:
        run, metrics, train_seconds = ensure_run(case, cache)
    except Exception as error:  # noqa: BLE001 - a case that cannot train is reported, not fatal
        return CaseResult(case.name, case.family, case.label, case.split, case.expected, case.onset,
                          case.save_interval, case.description, False, "", 0.0, 0.0, {},
                          f"training failed: {type(error).__name__}: {error}")  # fmt: skip
    symptom_ok, seen = verify(case, metrics)
    started = time.perf_counter()
    verdicts: dict[str, Verdict] = {}
    done: list[tuple[list[str], str, int, Path]] = []  # (rules, stdout, exit code, output dir)
    for name, rules in sorted(rule_sets.items(), key=lambda item: -len(item[1])):  # the largest set runs
        wider = next((d for d in done if set(rules) <= set(d[0])), None)
        if wider is not None and not os.environ.get("TRAINGUARD_DETECTION_SEPARATE_RUNS"):
            verdicts[name] = subset_verdict(wider[1], wider[3], rules, wider[2])
            continue
        output_dir = run.parent / f"rule-output-{name}"
        stdout, exit_code, stderr = _rules_run(run, rules, output_dir)
        verdicts[name] = parse_output(stdout, exit_code, stderr)
        done.append((rules, stdout, exit_code, output_dir))
    return CaseResult(
        case.name, case.family, case.label, case.split, case.expected, case.onset, case.save_interval,
        case.description, symptom_ok, seen, train_seconds, time.perf_counter() - started, verdicts,
    )  # fmt: skip
