"""The dashboard in a real browser (headless Chromium + Selenium) over real runs.

* the list shows a run that is training, as running; its page's loss chart gains points while it
  trains (the page polls; no reload);
* an exploding run (``examples/faulty/exploding_lr.py`` under ``trainguard run --rules
  --stop-on-issue``) shows its non-finite markers, the primary finding, its fix and the stop;
* the same run served from ``s3://`` (moto's server) renders the same;
* the pages request nothing outside the server, and the browser reports no CSP violation.

Screenshots land in each test's tmp dir (and in $TRAINGUARD_UI_SCREENSHOTS when set).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.ui.conftest import save_screenshot
from trainguard.ui import serve_paths

pytest.importorskip("selenium")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

WAIT_S = 120  # generous: the machine is loaded; nothing here measures time


def _wait(driver, condition, timeout: float = WAIT_S, message: str = ""):  # noqa: ANN001
    # the page re-renders what it polls: an element found just before a refresh is stale when read
    ignored = (StaleElementReferenceException,)
    return WebDriverWait(driver, timeout, poll_frequency=0.25, ignored_exceptions=ignored).until(
        lambda d: condition(d), message
    )


def _chart(driver, chart_id: str) -> dict[str, str]:
    return driver.execute_script(
        "const n = document.getElementById(arguments[0]); return n ? Object.assign({}, n.dataset) : null;", chart_id
    )


def _open_run(driver, server, name: str) -> None:  # noqa: ANN001
    driver.get(server.url)
    link = _wait(
        driver, lambda d: next((a for a in d.find_elements(By.CSS_SELECTOR, "td.name a") if a.text == name), None)
    )
    driver.get(link.get_attribute("href"))
    _wait(driver, lambda d: d.find_element(By.ID, "name").text == name)


_FACTS_SCRIPT = """
const text = (selector) => { const n = document.querySelector(selector); return n ? n.innerText : null; };
return {
    status: text('#facts .badge'), primary: text('#primary-rule'), message: text('#primary-message'),
    fix: text('#primary-fix'), stop: text('#stop-line'), reading: text('#series-state'),
    rules: Array.from(document.querySelectorAll('#rules-table tbody tr')).map(r => r.dataset.status),
    charts: Object.fromEntries(Array.from(document.querySelectorAll('#charts .chart')).map(
        c => [c.id, [c.dataset.points, c.dataset.nonfinite]])),
    nonfinite_text: Array.from(document.querySelectorAll('#charts .nonfinite')).map(n => n.innerText.trim())
        .filter(Boolean).sort().join(' '),
};
"""


def _page_facts(driver) -> dict[str, object]:  # noqa: ANN001
    """What the exploding run's page shows once it has read the whole run (one snapshot, taken in
    the page: its tables are redrawn as it polls), to compare a local and an s3:// rendering."""

    def complete(d):  # noqa: ANN001, ANN202
        facts = d.execute_script(_FACTS_SCRIPT)
        done = (
            facts["primary"]
            and facts["stop"]
            and facts["reading"] == ""
            and d.execute_script("return document.body.dataset.cursor !== undefined")
        )
        return facts if done and sum(int(n or 0) for _, n in facts["charts"].values()) else None

    facts = _wait(driver, complete)
    facts.pop("reading")
    return facts


def _nonfinite_tensors(run: Path) -> list[tuple[str, int]]:
    """(tensor, first step) of each loss, weight or gradient holding NaN/inf, read with the trial."""
    import numpy as np

    from trainguard.trial import create_trial

    trial = create_trial(str(run))
    drawn = set()
    for collection in ("losses", "weights", "gradients"):
        if collection in trial.collections():
            drawn.update(trial.tensor_names(collection=collection))
    found: dict[str, int] = {}
    for step in trial.steps():
        names = [name for name in trial.tensor_names(step=step) if name in drawn]
        for name, value in trial.tensor_values(names, step).items():
            if name not in found and not np.all(np.isfinite(value)):
                found[name] = step
    return sorted(found.items())


def test_live_run_listed_running_and_its_loss_chart_grows(browser, live_training, tmp_path: Path) -> None:
    run, process = live_training
    server = serve_paths([str(run.parent)])
    try:
        browser.get(server.url)
        row = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-status=running]"))[0]
        assert "live-mlp" in row.text
        save_screenshot(browser, tmp_path, "ui-list-running")
        _open_run(browser, server, "live-mlp")
        first = int(_wait(browser, lambda d: (_chart(d, "chart-losses") or {}).get("points")))
        first_step = float(_chart(browser, "chart-losses")["lastX"])
        # the same page, not reloaded, draws later steps as the training writes them
        _wait(browser, lambda d: int(_chart(d, "chart-losses")["points"]) > first + 5, message="no new points drawn")
        later = _chart(browser, "chart-losses")
        assert float(later["lastX"]) > first_step
        assert process.poll() is None, "the training must still be running while the chart grows"
        assert browser.find_element(By.CSS_SELECTOR, "#facts .badge").text == "running"
        save_screenshot(browser, tmp_path, "ui-run-live")
    finally:
        server.close()


def test_exploding_run_shows_nonfinite_markers_primary_fix_and_stop(
    browser, exploding_run: Path, tmp_path: Path
) -> None:
    server = serve_paths([str(exploding_run.parent)])
    try:
        browser.get(server.url)
        row = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-status=stopped]"))[0]
        assert "ExplodingTensor at step" in row.text
        _open_run(browser, server, exploding_run.name)
        facts = _page_facts(browser)
        save_screenshot(browser, tmp_path, "ui-run-exploding")
    finally:
        server.close()
    assert facts["status"] == "stopped"
    assert facts["primary"] == "ExplodingTensor"
    assert "NaN/inf" in facts["message"]
    assert "lower the learning rate" in facts["fix"]
    assert facts["stop"].startswith("Training was stopped by ExplodingTensor at step ")
    assert "s after the finding" in facts["stop"]
    # every tensor the run holds NaN/inf in (the trial is the oracle) is marked on its chart
    broken = _nonfinite_tensors(exploding_run)
    assert broken, "the exploding run must hold non-finite values"
    for name, step in broken:  # a series is named "<tensor>[ · <mode>][ · <worker>]"
        marker = re.compile(rf"{re.escape(name)}( · [\w-]+)* (nan|\+inf|-inf) at step {step}\b")
        assert marker.search(facts["nonfinite_text"]), (name, step, facts["nonfinite_text"])
    assert sum(int(nonfinite) for _, nonfinite in facts["charts"].values()) >= len({name for name, _ in broken})


def test_s3_run_renders_the_same_as_local(
    browser, exploding_run: Path, s3_bucket: str, s3_endpoint: str, tmp_path: Path
) -> None:  # noqa: F811
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    for path in sorted(p for p in exploding_run.rglob("*") if p.is_file()):
        client.upload_file(
            str(path), s3_bucket, f"runs/{exploding_run.name}/{path.relative_to(exploding_run).as_posix()}"
        )
    local = serve_paths([str(exploding_run)])
    remote = serve_paths([f"s3://{s3_bucket}/runs"], endpoint_url=s3_endpoint)
    try:
        _open_run(browser, local, exploding_run.name)
        local_facts = _page_facts(browser)
        _open_run(browser, remote, exploding_run.name)
        remote_facts = _page_facts(browser)
        save_screenshot(browser, tmp_path, "ui-run-exploding-s3")
    finally:
        local.close()
        remote.close()
    assert remote_facts == local_facts


def test_pages_fetch_only_from_the_server_and_break_no_csp(browser, exploding_run: Path) -> None:
    server = serve_paths([str(exploding_run.parent)])
    try:
        # an earlier test's page, left open, polls its closed server until the browser leaves it
        # (CI: ERR_CONNECTION_REFUSED from another port): leave it first, then drop its lines
        browser.get("about:blank")
        browser.get_log("browser")
        for page in ("", f"run.html?id={_first_id(server)}"):
            browser.get(server.url + page)
            _wait(browser, lambda d: d.execute_script("return document.readyState") == "complete")
            _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "td.name a, #primary-rule"))
            urls = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
            assert urls and all(url.startswith(server.url) for url in urls), urls
        problems = [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
        assert not problems, problems
    finally:
        server.close()


def _first_id(server) -> str:  # noqa: ANN001
    return server.dashboard.list_runs()[1]["runs"][0]["id"]


def test_trainguard_ui_command_prints_a_loopback_url(exploding_run: Path) -> None:
    from tests.ui.conftest import REPO, trainguard_command

    process = subprocess.Popen(
        trainguard_command("ui", str(exploding_run.parent), "--port", "0"),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = process.stdout.readline()
        assert "at http://127.0.0.1:" in line, line + process.stderr.read()
        import json
        import urllib.request

        url = line.rsplit(" at ", 1)[1].strip()
        with urllib.request.urlopen(url + "api/runs", timeout=60) as response:
            runs = json.loads(response.read())["runs"]
        assert [run["name"] for run in runs] == [exploding_run.name]
        assert runs[0]["status"] == "stopped"
    finally:
        process.terminate()
        process.wait(30)


def test_compare_overlays_the_runs_with_their_names(browser, exploding_run: Path, tmp_path: Path) -> None:
    import shutil

    runs = tmp_path / "runs"
    shutil.copytree(exploding_run, runs / "first")
    shutil.copytree(exploding_run, runs / "second")
    server = serve_paths([str(runs)])
    try:
        ids = ",".join(row["id"] for row in server.dashboard.list_runs()[1]["runs"])
        browser.get(server.url + f"compare.html?ids={ids}")
        labels = _wait(browser, lambda d: d.execute_script(
            "const c = document.getElementById('compare-chart-losses');"
            "return c ? Array.from(c.querySelectorAll('.u-legend .u-label')).map(n => n.textContent) : null;"
        ))  # fmt: skip
    finally:
        server.close()
    losses = [label for label in labels if "Loss" in label]
    assert sorted(label.split(" · ")[0] for label in losses) == ["first", "second"]
    assert len({label.split(" · ", 1)[1] for label in losses}) == 1  # the same series, once per run
