"""Fixtures of the dashboard tests: real runs (a live one, an exploding one stopped by a rule),
a dashboard server over them, and headless Chromium driven by Selenium."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.s3_server import s3_bucket, s3_endpoint  # noqa: F401  (fixtures)

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def save_screenshot(driver, tmp_path: Path, name: str) -> Path:  # noqa: ANN001 - a selenium WebDriver
    """The page as PNG under the test's tmp dir, copied to $TRAINGUARD_UI_SCREENSHOTS when set."""
    height = driver.execute_script("return Math.min(6000, document.body.scrollHeight + 40)")
    driver.set_window_size(1400, max(900, int(height)))
    target = tmp_path / f"{name}.png"
    driver.save_screenshot(str(target))
    wanted = os.environ.get("TRAINGUARD_UI_SCREENSHOTS")
    if wanted:
        Path(wanted).mkdir(parents=True, exist_ok=True)
        shutil.copy(target, Path(wanted) / target.name)
    return target


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    webdriver = pytest.importorskip("selenium.webdriver", reason="pip install selenium (the test extra)")
    from selenium.webdriver.chrome.service import Service

    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("needs Debian's chromium and chromedriver (scripts/test.sh installs them as root)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000",
                 "--disable-background-networking", "--disable-component-update", "--no-first-run"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()


def trainguard_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainguard.cli", *args]


@pytest.fixture(scope="session")
def exploding_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/faulty/exploding_lr.py under ``trainguard run --rules --stop-on-issue``: NaN/inf
    from the first saves, ExplodingTensor fires and stops training (trainguard-stop.json)."""
    pytest.importorskip("torch")
    run = tmp_path_factory.mktemp("ui-runs") / "runs" / "exploding-lr"
    completed = subprocess.run(
        trainguard_command("run", "--out", str(run), "--rules", "--stop-on-issue", "--",
                           sys.executable, str(REPO / "examples/faulty/exploding_lr.py")),
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert completed.returncode == 3, completed.stderr[-3000:]  # 3: stopped by a rule
    assert (run / "trainguard-stop.json").exists()
    return run


@pytest.fixture
def live_training(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen]]:
    """A training process writing a run under ``tmp_path/runs`` one step every 0.2 s."""
    pytest.importorskip("torch")
    run = tmp_path / "runs" / "live-mlp"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.ui._slow_train", str(run), "--steps", "2000", "--sleep", "0.2"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (run / "index").exists():
            assert process.poll() is None, process.stderr.read().decode()[-3000:] if process.stderr else ""
            assert time.monotonic() < deadline, "the training wrote no step within 300 s"
            time.sleep(0.5)
        yield run, process
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
