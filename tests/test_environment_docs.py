"""docs/environment.md names every TRAINGUARD_* variable the library, the services and the stack read, and
no variable they no longer read: the page is checked against the code instead of kept by hand."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "environment.md"
# A whole name: a prefix that code completes at run time (f"TRAINGUARD_SMTP_{key}") is no
# variable of its own, and its completions are on the page one by one.
NAME = re.compile(r"\bTRAINGUARD_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_{])")


# The library and the services (Python), and what builds and starts the images and the stack.
CODE = [("src", "*.py"), ("services", "*.py"), ("containers", "*"), ("infra", "*"), ("deploy", "*")]
FILES = ["docker-compose.yml"]


def names_in_code() -> dict[str, str]:
    """Each TRAINGUARD_* name the code reads or sets, with the first file naming it."""
    paths = [path for folder, pattern in CODE for path in sorted((ROOT / folder).rglob(pattern))]
    found: dict[str, str] = {}
    for path in [*paths, *(ROOT / name for name in FILES)]:
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a binary file: no settings in it
            continue
        for name in NAME.findall(text):
            found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def names_on_page(text: str) -> set[str]:
    return set(NAME.findall(text))


def test_every_variable_the_code_reads_is_documented() -> None:
    code = names_in_code()
    assert len(code) > 50  # the scan sees the settings table, not an empty tree
    missing = sorted(f"{name} ({where})" for name, where in code.items() if name not in names_on_page(PAGE.read_text()))
    assert not missing, f"add to docs/environment.md: {', '.join(missing)}"


def test_every_documented_variable_is_still_read() -> None:
    code = names_in_code()
    stale = sorted(names_on_page(PAGE.read_text()) - set(code))
    assert not stale, f"docs/environment.md lists variables nothing reads any more: {', '.join(stale)}"


def test_the_scan_tells_a_new_variable_from_a_prefix(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text('os.environ.get("TRAINGUARD_NEW_KNOB")\nenv[f"TRAINGUARD_SMTP_{key.upper()}"]\n')
    found = {name for name in NAME.findall(source.read_text())}
    assert found == {"TRAINGUARD_NEW_KNOB"}
    assert "TRAINGUARD_NEW_KNOB" not in names_on_page(PAGE.read_text())
