"""The report as a browser shows it: headless Chromium draws every chart (uPlot, inlined), shows
the findings and fetches nothing. A screenshot is kept in test-artifacts/report/ for people to look at.

Needs the Debian packages ``chromium`` and ``chromium-driver`` (CI installs them); skipped, with
that reason, where they are not installed.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.report._browser import WebDriver, find_chromium, screenshot
from tests.report._fixtures import OVERFIT_HINT, VANISHING_HINT
from trainguard.cli import main
from trainguard.modes import ModeKeys
from trainguard.trial import create_trial

BROWSER, DRIVER = find_chromium()
pytestmark = pytest.mark.skipif(
    BROWSER is None or DRIVER is None,
    reason="headless Chromium not installed: apt-get update && apt-get install -y chromium chromium-driver",
)
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "report"

# For every chart: its box on screen, its canvas, the points the page drew and its legend's labels.
_CHARTS_SCRIPT = """
return Array.from(document.querySelectorAll('.chart')).map(card => {
    const box = card.getBoundingClientRect();
    const canvas = card.querySelector('canvas');
    const labels = Array.from(card.querySelectorAll('.u-legend .u-series .u-label')).map(n => n.textContent);
    return {id: card.id, width: box.width, height: box.height, canvas: canvas ? canvas.width : 0,
            points: Number(card.dataset.points), nonfinite: Number(card.dataset.nonfinite), labels: labels.slice(1)};
});
"""


def _documents(page: Path) -> dict:
    """The JSON the report inlines: the same documents the live dashboard serves."""
    text = page.read_text(encoding="utf-8")
    return json.loads(text.split('<script type="application/json" id="tg-data">', 1)[1].split("</script>", 1)[0])


@pytest.fixture(scope="module")
def rendered(full_run: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The full run's report written by the CLI, opened in Chromium; what the page shows."""
    output = tmp_path_factory.mktemp("html") / "report.html"
    assert main(["report", str(full_run), "-o", str(output)]) == 0
    with WebDriver(BROWSER, DRIVER) as driver:
        driver.open("about:blank")
        driver.requested_urls()  # drop what the browser's start page loaded
        driver.open(output.as_uri())
        time.sleep(1.0)  # the charts are drawn, and anything the page would fetch late is requested by now
        found = {
            "charts": driver.run_script(_CHARTS_SCRIPT),
            "text": driver.run_script("return document.body.innerText;"),
            "error": driver.run_script(
                "const e = document.getElementById('error'); return e.hidden ? '' : e.textContent;"
            ),
            "rule_rows": driver.run_script(
                "return Array.from(document.querySelectorAll('#rules-table tbody tr')).map(r => "
                "Array.from(r.cells).map(c => c.innerText));"
            ),
            "csp": driver.run_script(
                "const m = document.querySelector('meta[http-equiv=\"Content-Security-Policy\"]');"
                "return m && m.content;"
            ),
            "urls": driver.requested_urls(),
        }
    found["output"] = output
    found["documents"] = _documents(output)
    found["trial"] = create_trial(str(full_run))
    return found


def test_every_chart_is_drawn_with_its_points(rendered: dict) -> None:
    assert rendered["error"] == ""
    documents = rendered["documents"]
    series = next(value for key, value in documents.items() if key.endswith("/series"))
    detail = next(value for key, value in documents.items() if key.startswith("api/runs/") and key.count("/") == 2)
    expected = series["charts"] + detail["profiler"]["charts"]
    assert len(expected) >= 10
    shown = {chart["id"]: chart for chart in rendered["charts"]}
    assert {chart["id"] for chart in expected} <= set(shown)
    for chart in expected:
        on_screen = shown[chart["id"]]
        assert on_screen["width"] > 300 and on_screen["height"] > 150 and on_screen["canvas"] > 300, chart["title"]
        finite = sum(sum(y is not None for y in line["y"]) for line in chart["series"])
        assert on_screen["points"] == finite, chart["title"]
        # legends carry whole names, every series
        assert on_screen["labels"][: len(chart["series"])] == [line["label"] for line in chart["series"]]
    loss = next(chart for chart in series["charts"] if chart["id"] == "chart-losses")
    loss_tensor = rendered["trial"].tensor("CrossEntropyLoss_output_0")
    assert {line["label"]: len(line["x"]) for line in loss["series"]} == {
        f"CrossEntropyLoss_output_0 · {mode.name}": len(loss_tensor.steps(mode=mode))
        for mode in (ModeKeys.EVAL, ModeKeys.TRAIN)
    }
    assert shown["chart-cpu-utilization"]["points"] == 150
    assert shown["chart-step-duration"]["points"] >= 12
    assert shown["chart-histogram"]["canvas"] > 300  # the weight histogram at the slider's step


def test_findings_with_status_step_and_fix_hint_are_shown(rendered: dict) -> None:
    text = rendered["text"]
    lower = text.lower()  # innerText follows the CSS (upper-case labels)
    assert "primary finding" in lower and "vanishinggradient at step 4" in lower and VANISHING_HINT in text
    assert "overfit at step 30" in lower and OVERFIT_HINT in text
    rows = {row[0].split("\n")[0]: row for row in rendered["rule_rows"]}
    assert rows["VanishingGradient"][1] == "IssuesFound" and rows["VanishingGradient"][2] == "2 from step 4"
    assert rows["Overfit-eval"][1] == "IssuesFound" and rows["LossNotDecreasing"][1] == "NoIssuesFound"
    assert rows["DeadRelu"][1] == "not evaluated" and "InsufficientInformation" in rows["DeadRelu"][4]


def test_the_page_requests_nothing_but_itself(rendered: dict) -> None:
    urls = rendered["urls"]
    assert rendered["output"].as_uri() in urls  # the log works: it saw the page itself
    assert [url for url in urls if not url.startswith(("file://", "data:", "about:"))] == []
    csp = rendered["csp"]
    assert "default-src 'none'" in csp and "unsafe-inline" not in csp and "script-src 'sha256-" in csp
    page = rendered["output"].read_text()
    assert not re.search(r"""(src|href)=["']?https?:""", page)


def test_screenshot_shows_the_report(rendered: dict) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    target = ARTIFACTS / "report.png"
    target.unlink(missing_ok=True)
    screenshot(BROWSER, rendered["output"].as_uri(), target, width=1400, height=3000)
    with WebDriver(BROWSER, DRIVER) as driver:
        stats = driver.image_statistics(target)
    assert (stats["width"], stats["height"]) == (1400, 3000)
    assert stats["colours"] > 50  # text, lines in several colours, status badges: not a blank page
    assert stats["near_white_share"] < 0.97


def test_a_run_without_rules_or_profiler_says_so_in_the_page(plain_run: Path, tmp_path: Path) -> None:
    output = tmp_path / "plain.html"
    assert main(["report", str(plain_run), "-o", str(output), "--steps", "0,20"]) == 0
    with WebDriver(BROWSER, DRIVER) as driver:
        driver.open(output.as_uri())
        sections = driver.run_script(
            "return Object.fromEntries(Array.from(document.querySelectorAll('section')).map(s => [s.id, s.innerText]));"
        )
        hidden = driver.run_script("return document.getElementById('profiler-section').hidden;")
        steps = driver.run_script("return JSON.parse(document.getElementById('histogram-step').dataset.steps);")
        tensor = driver.run_script("return document.getElementById('histogram-tensor').value;")
    assert "No rule results" in sections["diagnosis"]
    assert hidden  # no profiler data: no profiler section
    assert tensor == "Net_fc1.weight" and steps == [0, 20]  # the weights first, at the steps asked for
