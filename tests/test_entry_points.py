"""The package's own entry points: ``python -m trainguard`` is the command line, ``python -m
trainguard.rules`` the rule runner as a process, and the library below them never imports the
command line (the one arrow that ran back up, and an import circle, was the runner's
``__main__`` importing ``trainguard.commands.rules``)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "trainguard"
# trainguard.launch is `trainguard run`'s half of the command line (its options and supervision)
COMMAND_LINE = ("trainguard.cli", "trainguard.commands", "trainguard.launch")


def _run(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *arguments], capture_output=True, text=True, timeout=120)


def test_python_dash_m_trainguard_is_the_command_line() -> None:
    done = _run("trainguard", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: trainguard ")
    for verb in ("run", "rules"):
        assert verb in done.stdout


def test_python_dash_m_trainguard_rules_runs_the_runner() -> None:
    done = _run("trainguard.rules", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m trainguard.rules ")
    assert "--rule" in done.stdout and "--progress" in done.stdout  # trainguard rules run's options


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):  # nested imports too
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_library_never_imports_the_command_line() -> None:
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in ("cli.py", "commands", "launch") or path.name == "__main__.py":
            continue  # the command line itself and entry points (nothing imports them)
        used = sorted(n for n in _imports(path) if any(n == c or n.startswith(c + ".") for c in COMMAND_LINE))
        if used:
            offenders[str(relative)] = used
    assert offenders == {}
