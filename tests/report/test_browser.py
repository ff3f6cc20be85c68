"""The report as a browser shows it: headless Chromium renders every plot, shows the findings and
fetches nothing. A screenshot is kept in test-artifacts/report/ for people to look at.

Needs the Debian packages ``chromium`` and ``chromium-driver`` (CI installs them); skipped, with
that reason, where they are not installed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.report._browser import WebDriver, find_chromium, screenshot
from tests.report._fixtures import OVERFIT_HINT, VANISHING_HINT
from trainguard.cli import main
from trainguard.report import gather_report

BROWSER, DRIVER = find_chromium()
pytestmark = pytest.mark.skipif(
    BROWSER is None or DRIVER is None,
    reason="headless Chromium not installed: apt-get update && apt-get install -y chromium chromium-driver",
)
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "report"

# For every chart: its box on screen, and per drawn series the number of points in its path.
_CHARTS_SCRIPT = """
return Array.from(document.querySelectorAll('svg.chart')).map(svg => {
    const box = svg.getBoundingClientRect();
    const paths = Array.from(svg.querySelectorAll('path.series')).map(path => ({
        label: path.dataset.label,
        points: path.getAttribute('d').split('L').length,
        length: path.getTotalLength(),
        width: path.getBBox().width,
    }));
    return {id: svg.id, width: box.width, height: box.height, paths: paths};
});
"""


@pytest.fixture(scope="module")
def rendered(full_run: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The full run's report written by the CLI, opened in Chromium; what the page shows."""
    output = tmp_path_factory.mktemp("html") / "report.html"
    assert main(["report", str(full_run), "-o", str(output)]) == 0
    with WebDriver(BROWSER, DRIVER) as driver:
        driver.open("about:blank")
        driver.requested_urls()  # drop what the browser's start page loaded
        driver.open(output.as_uri())
        time.sleep(0.5)  # anything the page would fetch late (fonts, icons) is requested by now
        found = {
            "charts": driver.run_script(_CHARTS_SCRIPT),
            "text": driver.run_script("return document.body.innerText;"),
            "finding_rows": driver.run_script(
                "return Array.from(document.querySelectorAll('table.findings tbody tr')).map(r => "
                "Array.from(r.cells).map(c => c.innerText));"
            ),
            "csp": driver.run_script(
                "const m = document.querySelector('meta[http-equiv=\"Content-Security-Policy\"]');"
                "return m && m.content;"
            ),
            "urls": driver.requested_urls(),
        }
    found["output"] = output
    found["data"] = gather_report(full_run)
    return found


def test_every_expected_chart_is_drawn_with_its_points(rendered: dict) -> None:
    data = rendered["data"]
    expected = (
        data.tensors.scalar_charts + data.tensors.weight_norm_charts + data.tensors.bias_norm_charts
        + data.tensors.gradient_norm_charts + data.tensors.histogram_charts + data.tensors.activation_charts
        + data.profiler.system_charts + data.profiler.step_charts
    )  # fmt: skip
    assert len(expected) >= 15
    shown = {chart["id"]: chart for chart in rendered["charts"]}
    assert sorted(shown) == sorted(chart.chart_id for chart in expected)
    for chart in expected:
        on_screen = shown[chart.chart_id]
        assert on_screen["width"] > 300 and on_screen["height"] > 100, chart.title
        assert [path["label"] for path in on_screen["paths"]] == [series.label for series in chart.series], chart.title
        for path, series in zip(on_screen["paths"], chart.series, strict=True):
            # a histogram outline has 2 points per bin plus the two ends on the axis
            want = 2 * len(series.y) + 2 if chart.kind == "histogram" else len(series.finite_points())
            assert path["points"] == want, (chart.title, series.label)
            if want > 1:
                assert path["length"] > 50 and path["width"] > 10, (chart.title, series.label)
    loss = shown["chart-crossentropyloss-output-0"]
    assert {path["label"]: path["points"] for path in loss["paths"]} == {"EVAL": 6, "TRAIN": 15}
    assert shown["chart-cpu-utilization"]["paths"][0]["points"] == 150
    assert shown["chart-step-duration"]["paths"][0]["points"] >= 12


def test_findings_with_status_step_and_fix_hint_are_shown(rendered: dict) -> None:
    rows = rendered["finding_rows"]
    assert [(row[0], row[1], row[2]) for row in rows] == [
        ("Overfit", "IssuesFound", "30"),
        ("VanishingGradient", "IssuesFound", "4"),
        ("VanishingGradient", "IssuesFound", "12"),
    ]
    # columns: rule, status, step, worker, what was found, how to fix
    assert rows[0][5] == OVERFIT_HINT and rows[1][5] == VANISHING_HINT
    text = rendered["text"]
    for expected in ("NoIssuesFound", "Error", "InsufficientInformation", "relu_output", "Steps per mode", "TRAIN: 15"):
        assert expected in text


def test_the_page_requests_nothing_but_itself(rendered: dict) -> None:
    urls = rendered["urls"]
    assert rendered["output"].as_uri() in urls  # the log works: it saw the page itself
    assert [url for url in urls if not url.startswith(("file://", "data:", "about:"))] == []
    assert "default-src 'none'" in rendered["csp"]
    page = rendered["output"].read_text()
    assert "http://" not in page and "https://" not in page and "<script" not in page


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
        svg_ids = driver.run_script("return Array.from(document.querySelectorAll('svg.chart')).map(s => s.id);")
    assert "No rule results" in sections["findings"]
    assert "No system metrics to plot." in sections["system"]
    assert "No step timings to plot." in sections["steps"]
    assert "At global steps 0, 20." in sections["histograms"]
    assert not any(identifier.startswith(("chart-cpu", "chart-step")) for identifier in svg_ids)
    assert "chart-net-fc1-weight-distribution" in svg_ids
