"""bench/RESULTS.md is what bench/results.json renders, and recording a figure is one call that
replaces its row: the page of current figures cannot drift from its source or grow into a log."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import results_table
from bench.results_table import Figure, load, record, render, save

ROOT = Path(__file__).resolve().parents[2]


def _row(**changes: object) -> dict[str, object]:
    row: dict[str, object] = {
        "section": "Sentinel (bench/sentinel_cost.py)",
        "figure": "parts per step",
        "value": 0.147,
        "unit": "%",
        "command": "python bench/sentinel_cost.py --pairs 4",
        "commit": "0fc26c7",
        "date": "2026-12-02",
    }
    row.update(changes)
    return row


def test_results_md_is_the_render_of_results_json() -> None:
    figures = load(results_table.RESULTS_JSON)
    assert len(figures) > 100  # the migrated figures are there, not an empty table
    assert results_table.RESULTS_MD.read_text(encoding="utf-8") == render(figures), (
        "bench/RESULTS.md differs from bench/results.json: run python -m bench.results_table"
    )
    assert results_table.main(["--check"]) == 0


def test_every_command_names_a_bench_script_that_exists() -> None:
    for figure in load(results_table.RESULTS_JSON):
        for script in re.findall(r"bench/([\w/]+\.py)", figure.command):
            assert (ROOT / "bench" / script).is_file(), f"{figure.key}: {script} is not in bench/"
        for module in re.findall(r"-m bench\.(\w+)", figure.command):
            assert (ROOT / "bench" / f"{module}.py").is_file(), f"{figure.key}: bench.{module} is gone"


def test_record_replaces_the_row_of_its_figure_and_appends_a_new_one_to_its_section(tmp_path: Path) -> None:
    results, page = tmp_path / "results.json", tmp_path / "RESULTS.md"
    other = _row(section="Dashboard (bench/ui_speed.py)", figure="live p95", value=0.61, unit="s")
    results.write_text(json.dumps({"figures": [_row(), other]}))

    record(**{**_row(value=0.2, commit="abc1234"), "results": results, "page": page})  # type: ignore[arg-type]
    record(**{**_row(figure="appending, per step", value=394, unit="ns"), "results": results, "page": page})  # type: ignore[arg-type]

    figures = load(results)
    assert [(f.figure, f.value, f.commit) for f in figures] == [
        ("parts per step", 0.2, "abc1234"),  # replaced in place: the old value is git's
        ("appending, per step", 394, figures[1].commit),  # after its section's rows, not at the end
        ("live p95", 0.61, "0fc26c7"),
    ]
    assert page.read_text() == render(figures)
    assert "| parts per step | 0.2% |" in page.read_text()


def test_the_command_line_record_is_one_line(tmp_path: Path) -> None:
    results, page = tmp_path / "results.json", tmp_path / "RESULTS.md"
    argv = ["--results", str(results), "--page", str(page), "record", "--section", "Teardown (bench/x.py)"]
    argv += ["--figure", "warning after", "--value", "300", "--unit", "s", "--command", "python bench/x.py | tee log"]
    argv += ["--date", "2026-12-02", "--commit", "d14d01c"]
    assert results_table.main(argv) == 0
    (figure,) = load(results)
    assert figure.value == 300 and isinstance(figure.value, int)
    text = page.read_text()
    assert "## Teardown (bench/x.py)" in text
    assert "`python bench/x.py \\| tee log`" in text  # a pipe in a command does not split the cell
    assert results_table.main(["--results", str(results), "--page", str(page), "--check"]) == 0
    page.write_text(text.replace("300 s", "299 s"))
    assert results_table.main(["--results", str(results), "--page", str(page), "--check"]) == 1


@pytest.mark.parametrize(
    "changes",
    [{"command": ""}, {"commit": " "}, {"date": "2 Dec 2026"}, {"value": None}, {"value": True}],
)
def test_a_figure_without_its_command_commit_date_or_value_is_refused(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Figure(**_row(**changes))  # type: ignore[arg-type]


def test_two_rows_of_one_figure_are_refused(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"figures": [_row(), _row(value=1.0)]}))
    with pytest.raises(ValueError, match="twice"):
        load(results)


def test_a_record_holds_results_json_while_it_rewrites_it(tmp_path: Path) -> None:
    fcntl = pytest.importorskip("fcntl")
    results = tmp_path / "results.json"

    def lock_taken_elsewhere() -> bool:
        with open(results, "rb") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(other, fcntl.LOCK_UN)
            return False

    with results_table._locked(results):
        assert lock_taken_elsewhere()  # a second session's record waits here
    assert not lock_taken_elsewhere()
    record(**{**_row(), "results": results, "page": tmp_path / "RESULTS.md"})  # type: ignore[arg-type]
    assert [f.figure for f in load(results)] == ["parts per step"]  # from an empty (new) file


def test_the_readme_headline_figures_are_the_render_of_results_json() -> None:
    figures = load(results_table.RESULTS_JSON)
    readme = results_table.README.read_text(encoding="utf-8")
    assert readme == results_table.readme_with_headlines(readme, figures), (
        "the README's headline figures differ from bench/results.json: run python -m bench.results_table"
    )
    block = readme[readme.index(results_table.README_START) : readme.index(results_table.README_END)]
    assert len(block.splitlines()) == len(results_table.HEADLINES) + 3  # marker, header, rule, one row each
    for section, figure in results_table.HEADLINES:
        assert figure in block, (section, figure)


def test_a_headline_whose_row_is_gone_is_an_error_and_record_refreshes_the_readme(tmp_path: Path) -> None:
    figures = load(results_table.RESULTS_JSON)
    key = results_table.HEADLINES[0]
    with pytest.raises(KeyError, match="headline figure"):
        results_table.render_headlines([f for f in figures if f.key != key])
    with pytest.raises(ValueError, match="no headline markers"):
        results_table.readme_with_headlines("# a README without them\n", figures)

    results, page, readme = tmp_path / "results.json", tmp_path / "RESULTS.md", tmp_path / "README.md"
    save(figures, results)
    readme.write_text(f"intro\n{results_table.README_START}\nold table\n{results_table.README_END}\nrest\n")
    old = next(f for f in figures if f.key == key)
    record(section=key[0], figure=key[1], value=1.234, unit="x", command=old.command, commit="abc1234",
           results=results, page=page, readme=readme)  # fmt: skip
    text = readme.read_text()
    assert "old table" not in text and "| 1.234x |" in text and text.startswith("intro\n") and text.endswith("rest\n")
