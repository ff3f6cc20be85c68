"""``python -m bench.detection [--split all|calibration|holdout] [--jobs N] [--cases NAME ...]``

Trains every case of the corpus (cached under ``--cache``), runs ``trainguard rules run --json``
over each with the default rule set and with every debugger rule, and prints the scores per
split. ``--doc`` rewrites docs/rules-calibration.md with the figures; ``--json FILE`` keeps them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from bench.detection import all_cases
from bench.detection.report import as_json, render, summarise
from bench.detection.score import CAPTURE_HASH_VARIABLE, CaseResult, Finding, Verdict, debugger_rules, default_rules, score_case

DEFAULT_CACHE = Path(os.environ.get("TRAINGUARD_DETECTION_CACHE", Path.home() / ".cache" / "trainguard-detection"))


def _score(arguments: tuple) -> CaseResult:  # type: ignore[type-arg]
    case, cache, rule_sets = arguments
    return score_case(case, cache, rule_sets)


def score_all(cases: list, cache: Path, jobs: int, rule_sets: dict[str, list[str]], quiet: bool = False,
              checkpoint: Path | None = None) -> list:  # fmt: skip
    """Score ``cases`` in ``jobs`` processes; with ``checkpoint``, the results so far are written
    there (as ``--json`` writes them) every few cases, so a run cut short still renders."""
    cache.mkdir(parents=True, exist_ok=True)
    work = [(case, cache, rule_sets) for case in cases]
    results: list[CaseResult] = []
    started = time.perf_counter()
    # fork: the parent never imports torch, so children start cheap and clean
    context = multiprocessing.get_context("fork")
    with context.Pool(max(1, jobs), maxtasksperchild=8) as pool:
        for index, result in enumerate(pool.imap(_score, work), 1):
            results.append(result)
            if checkpoint is not None and index % 5 == 0:
                _write_json(checkpoint, results, rule_sets)
            if not quiet:
                fired = ",".join(sorted(result.verdicts["all"].findings)) if "all" in result.verdicts else "-"
                if "all" in result.verdicts and result.verdicts["all"].error:
                    fired = f"no verdict ({result.verdicts['all'].error[:120]})"
                print(
                    f"[{index}/{len(work)} {time.perf_counter() - started:5.0f}s] {result.name}: "
                    f"{result.error or fired or 'silent'}",
                    file=sys.stderr,
                    flush=True,
                )
    return results


def _write_json(path: Path, results: list, rule_sets: dict[str, list[str]], summaries: list | None = None) -> None:
    if summaries is None:
        summaries = [summarise(results, split, rule_set) for split in ("all",) for rule_set in rule_sets]
    document = {"summaries": [as_json(summary) for summary in summaries], "cases": [asdict(result) for result in results]}
    partial = path.with_name(path.name + ".part")
    partial.write_text(json.dumps(document, indent=1, default=str), encoding="utf-8")
    partial.replace(path)


def load_results(path: Path) -> list[CaseResult]:
    """CaseResults back from a ``--json`` file."""
    document = json.loads(path.read_text(encoding="utf-8"))
    results = []
    for item in document["cases"]:
        verdicts = {}
        for name, verdict in item.pop("verdicts").items():
            findings = {rule: Finding(**finding) for rule, finding in verdict.pop("findings").items()}
            advice = {rule: Finding(**finding) for rule, finding in verdict.pop("advice", {}).items()}
            verdicts[name] = Verdict(findings=findings, advice=advice, **verdict)
        item["expected"] = tuple(item["expected"])
        results.append(CaseResult(verdicts=verdicts, **item))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.detection", description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=["all", "calibration", "holdout"], default="all")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"captured runs (default {DEFAULT_CACHE})")
    parser.add_argument("--cases", nargs="*", help="only these case names (or name prefixes)")
    parser.add_argument("--doc", type=Path, help="write the calibration document here")
    parser.add_argument("--json", type=Path, help="write summaries and per-case verdicts here")
    parser.add_argument("--from-json", type=Path, nargs="+",
                        help="re-render scorings saved with --json (runs nothing; a case in several: the last)")  # fmt: skip
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--capture-hash", help="judge the captures the hook with this capture source hash made "
                        "(score.capture_source_hash of that tree): for rule changes only; a case not captured "
                        "under it is an error, not trained")  # fmt: skip
    args = parser.parse_args(argv)

    if args.capture_hash:
        os.environ[CAPTURE_HASH_VARIABLE] = args.capture_hash  # the worker processes inherit it
    cases = all_cases()
    if args.split != "all":
        cases = [case for case in cases if case.split == args.split]
    if args.cases:
        cases = [case for case in cases if any(case.name.startswith(prefix) for prefix in args.cases)]
    rule_sets = {"default": default_rules(), "all": debugger_rules()}
    if args.from_json:
        by_name = {result.name: result for path in args.from_json for result in load_results(path)}
        results = [by_name[case.name] for case in cases if case.name in by_name]
        wanted = {case.name for case in cases}
        results = [result for result in results if result.name in wanted]
    else:
        results = score_all(cases, args.cache, args.jobs, rule_sets, args.quiet, args.json)
    splits = ["calibration", "holdout"] if args.split == "all" else [args.split]
    summaries = [summarise(results, split, rule_set) for split in splits for rule_set in rule_sets]
    if args.split == "all":
        summaries += [summarise(results, "all", rule_set) for rule_set in rule_sets]
    for summary in summaries:
        print(render(summary))
    if args.json:
        _write_json(args.json, results, rule_sets, summaries)
    if args.doc:
        from bench.detection.document import write_document

        write_document(args.doc, cases, results, summaries, rule_sets)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
