"""The README's sample output of its main example, from a real run of the README's own command.

    python scripts/readme_samples.py           # run the example, rewrite the README's sample block
    python scripts/readme_samples.py --check   # run it, exit 1 when the README's block is stale

The sample block sits between ``<!-- sample-output: main -->`` and ``<!-- /sample-output -->``
in README.md. Only lines that do not depend on how far training got before the stop are shown
(the first finding, the stop, how the run finished, the rule counts, the diagnosis and its fix,
the rules that do not apply, the stop's line); the rest is elided with ``...``: findings at later
saved steps come or not with the machine's speed. Volatile parts (seconds, the count of findings
and of rules not evaluated, which follow from that speed too) are normalised before comparing.
``tests/summary/test_readme_samples.py`` runs the check, so the block cannot go stale.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN = "<!-- sample-output: main -->"
END = "<!-- /sample-output -->"
ELIDED = "..."

# Lines of the main example's output that are the same on every machine, in output order.
# (name, pattern, only the first match)
_STABLE: tuple[tuple[str, re.Pattern[str], bool], ...] = (
    ("live finding", re.compile(r"^trainguard: rule \S+ found an issue at step "), True),
    ("stop", re.compile(r"^trainguard: stopping training: "), True),
    ("finished", re.compile(r"^  finished    : "), True),
    ("rules", re.compile(r"^  rules       : "), True),
    ("diagnosis", re.compile(r"^  diagnosis   : "), True),
    ("fix", re.compile(r"^  fix         : "), True),
    ("not applicable", re.compile(r"^    \d+ rules? not applicable to this run: "), True),
    ("stopped", re.compile(r"^  stopped     : "), True),
)
_VOLATILE = (
    (re.compile(r"\b\d+(?:\.\d+)? s after the finding"), "<t> s after the finding"),
    (re.compile(r"\b\d+ found issues"), "<n> found issues"),
    (re.compile(r", \d+ not evaluated"), ""),
    (re.compile(r", \d+ gave advice"), ""),
)


def readme_command(readme: str) -> list[str]:
    """The main example's command: the README's first ``trainguard run`` line, without the
    ``pip install ... &&`` before it."""
    for line in readme.splitlines():
        if "trainguard run " in line and not line.lstrip().startswith(("#", "trainguard run [")):
            command = line.split("&&")[-1].strip()
            if command.startswith("trainguard run "):
                return shlex.split(command)
    raise SystemExit("README.md: no 'trainguard run' command found")


def run_example(command: Sequence[str], out_dir: str | os.PathLike[str], timeout: float = 600) -> tuple[str, int]:
    """The command's stdout and stderr, interleaved as a terminal shows them, and its exit status.

    ``--out`` is added so that the run lands in ``out_dir`` instead of ``trainguard-runs/``."""
    argv = list(command)
    if argv[:2] != ["trainguard", "run"]:
        raise SystemExit(f"not a trainguard run command: {shlex.join(argv)}")
    argv = [sys.executable, "-m", "trainguard.cli", "run", "--out", str(out_dir), *argv[2:]]
    done = subprocess.run(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False
    )
    return done.stdout, done.returncode


def sample_lines(output: str) -> list[str]:
    """The stable lines of ``output`` in order, ``...`` where lines were left out."""
    used: set[str] = set()
    picked: list[tuple[int, str]] = []
    lines = output.splitlines()
    for index, line in enumerate(lines):
        for name, pattern, first_only in _STABLE:
            if pattern.search(line) and not (first_only and name in used):
                used.add(name)
                picked.append((index, line.rstrip()))
                break
    sample: list[str] = []
    previous = -1
    for index, line in picked:
        if sample and index != previous + 1:
            sample.append(ELIDED)
        sample.append(line)
        previous = index
    return sample


def normalise(line: str) -> str:
    for pattern, replacement in _VOLATILE:
        line = pattern.sub(replacement, line)
    return line


def readme_block(readme: str) -> list[str]:
    """The lines of the README's sample block (inside its code fence)."""
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"README.md: no {BEGIN} ... {END} block")
    inner = readme.split(BEGIN, 1)[1].split(END, 1)[0]
    return [line for line in inner.strip().splitlines() if not line.startswith("```")]


def problems(readme: str, output: str) -> list[str]:
    """How the README's block differs from the stable lines of ``output`` (normalised); []: none."""
    shown = [normalise(line) for line in readme_block(readme)]
    fresh = [normalise(line) for line in sample_lines(output)]
    missing = [name for name, pattern, _ in _STABLE if not any(pattern.search(line) for line in fresh)]
    found = [f"the example's output has no {name} line" for name in missing]
    if shown != fresh:
        found.append(
            "README.md's sample output is stale; run: python scripts/readme_samples.py\n"
            + "\n".join(f"  README: {a!r}\n  run   : {b!r}" for a, b in zip(shown, fresh, strict=False) if a != b)
            + (f"\n  README has {len(shown)} lines, the run {len(fresh)}" if len(shown) != len(fresh) else "")
        )
    return found


def rewrite(readme: str, output: str) -> str:
    """``readme`` with its sample block replaced by the stable lines of ``output``."""
    head, rest = readme.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    block = "\n".join(["", "```", *sample_lines(output), "```", ""])
    return f"{head}{BEGIN}{block}{END}{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write; exit 1 when stale")
    args = parser.parse_args(argv)
    readme = README.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="trainguard-readme-") as directory:
        output, code = run_example(readme_command(readme), Path(directory) / "run")
    if args.check:
        found = problems(readme, output)
        for problem in found:
            print(problem, file=sys.stderr)
        return 1 if found else 0
    missing = [name for name, pattern, _ in _STABLE if not any(pattern.search(line) for line in output.splitlines())]
    if missing:
        print(f"the example (exit {code}) printed no {', '.join(missing)} line; README left alone:\n{output}")
        return 1
    README.write_text(rewrite(readme, output), encoding="utf-8")
    print(f"README.md: sample output rewritten from a real run (exit {code})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
