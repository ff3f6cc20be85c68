"""How fast the dashboard is: page-interactive time and server memory for 1 k and 10 k step runs,
and the delay from a step written by the hook to its point drawn in the browser.

    python bench/ui_speed.py [--work DIR] [--source RUN]

* runs: a 1,000-step run of ``tests/ui/_slow_train.py`` (losses, weights, gradients and ReLU
  outputs saved at every step; or ``--source``), and a 10,000-step run made of it (its event and
  index files copied under steps + 1000 k: the same bytes, so reading costs what a trained run's
  would);
* for each: ``trainguard ui RUN`` in its own process, headless Chromium opens the run page; times
  from navigation start to the DOM ready, to the loss chart first drawn, and to every curve drawn
  up to the last step (the server reads a long run in 0.5 s slices, so the page is usable while
  the rest fills in); the ui process's RSS (VmRSS, VmHWM) then;
* data layer alone (no browser, in this process): the time the dashboard's ``LiveRun`` takes to
  read every step of each run, and the memory of the objects it holds afterwards;
* live: a training writing one step every 0.5 s under a running ``trainguard ui``: for each step,
  the time its point was drawn (the chart's ``data-drawn-at``) minus its index file's mtime.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_run(target: Path, steps: int) -> None:
    subprocess.run([sys.executable, "-m", "tests.ui._slow_train", str(target), "--steps", str(steps), "--sleep", "0"],
                   cwd=REPO, check=True)  # fmt: skip


def replicate(source: Path, target: Path, times: int) -> int:
    """``source``'s steps copied ``times`` times under new step numbers (events, then indexes)."""
    shutil.copytree(source / "collections", target / "collections")
    indexes = sorted((source / "index").rglob("*.json"))
    span = 1 + max(int(path.name.split("_", 1)[0]) for path in indexes)
    for k in range(times):
        for path in indexes:
            step = int(path.name.split("_", 1)[0])
            worker = path.name.split("_", 1)[1].removesuffix(".json")
            new = step + k * span
            document = json.loads(path.read_text())
            event = source / document["meta"]["event_file_name"]
            name = f"events/{new:012d}/{new:012d}_{worker}.tfevents"
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(event, target / name)
            document["meta"]["event_file_name"] = name
            document["meta"]["mode_step"] = new
            index = target / f"index/{new // 1000:09d}/{new:012d}_{worker}.json"
            index.parent.mkdir(parents=True, exist_ok=True)
            index.write_text(json.dumps(document))
    shutil.copy(source / "training_job_end.ts", target / "training_job_end.ts")
    return span * times


def start_ui(path: Path) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-m", "trainguard.cli", "ui", str(path), "--port", "0"],
                               cwd=REPO, stdout=subprocess.PIPE, text=True)  # fmt: skip
    line = process.stdout.readline()
    return process, line.rsplit(" at ", 1)[1].strip()


def rss_mib(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def browser():  # noqa: ANN201 - a selenium WebDriver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)


_CHART = "const n = document.getElementById('chart-losses'); return n ? Object.assign({}, n.dataset) : null;"


def page_times(driver, url: str, last_step: int, timeout: float = 600) -> dict[str, float]:  # noqa: ANN001
    import urllib.request

    with urllib.request.urlopen(url + "api/runs", timeout=120) as answer:
        run_id = json.loads(answer.read())["runs"][0]["id"]
    driver.get(url + f"run.html?id={run_id}")
    origin = driver.execute_script("return performance.timeOrigin")
    first = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        chart = driver.execute_script(_CHART)
        if chart and first is None:
            first = float(chart["drawnAt"]) - origin
        cursor = driver.execute_script("return Number(document.body.dataset.cursor || -1)")
        if chart and cursor >= last_step and float(chart["lastX"]) >= last_step:
            break
        time.sleep(0.05)
    ready = driver.execute_script(
        "const t = performance.getEntriesByType('navigation')[0]; return t.domContentLoadedEventEnd"
    )
    return {"dom_ready_ms": ready, "first_chart_ms": first, "all_drawn_ms": float(chart["drawnAt"]) - origin,
            "loss_points": int(chart["points"])}  # fmt: skip


def data_layer(run: Path) -> tuple[float, float]:
    """(seconds to read every step, MiB of the objects the run holds afterwards) of the
    dashboard's data layer; the memory is counted as tests/ui/test_long_runs.py does (no
    tracemalloc: it would slow the reading it times)."""
    sys.path.insert(0, str(REPO))
    from tests.ui.test_long_runs import kept_bytes
    from trainguard.ui.discover import discover_runs
    from trainguard.ui.live import LiveRun

    started = time.monotonic()
    live = LiveRun(discover_runs([str(run)])[0][0], budget_s=float("inf"))
    while True:
        live.refresh(force=True)
        if live.last_step is not None and live.curves.cursor >= live.last_step:
            break
    return time.monotonic() - started, kept_bytes(live) / 2**20


def live_delays(driver, work: Path, steps: int = 60) -> list[float]:  # noqa: ANN001
    runs = work / "live"
    shutil.rmtree(runs, ignore_errors=True)  # a run of an earlier invocation
    runs.mkdir()
    process, url = start_ui(runs)
    training = subprocess.Popen([sys.executable, "-m", "tests.ui._slow_train", str(runs / "live-run"), "--steps",
                                 str(steps), "--sleep", "0.5"], cwd=REPO)  # fmt: skip
    drawn: dict[int, float] = {}
    try:
        while not (runs / "live-run" / "index").exists():
            time.sleep(0.2)
        driver.get(url)
        while not driver.find_elements("css selector", "td.name a"):
            time.sleep(0.1)
        driver.get(driver.find_element("css selector", "td.name a").get_attribute("href"))
        while training.poll() is None:
            chart = driver.execute_script(_CHART)
            if chart and int(float(chart["lastX"])) not in drawn:
                drawn[int(float(chart["lastX"]))] = float(chart["drawnAt"]) / 1000
            time.sleep(0.02)
    finally:
        training.wait()
        process.terminate()
        process.wait()
    from trainguard.format.layout import index_key

    delays = []
    for step, at in sorted(drawn.items()):
        written = (runs / "live-run" / index_key(step, "worker_0")).stat().st_mtime
        delays.append(at - written)
    return delays


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--source", help="a 1,000-step run to use instead of training one")
    parser.add_argument("--data-only", action="store_true", help="the data layer alone, no browser")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="tg-ui-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    small = Path(args.source) if args.source else work / "run-1k"
    if not small.exists():
        started = time.monotonic()
        make_run(small, 1000)
        print(f"trained run-1k in {time.monotonic() - started:.0f} s")
    large = work / "run-10k"
    if not large.exists():
        print(f"run-10k: {replicate(small, large, 10)} steps")
    for name, run in (("1k", small), ("10k", large)):
        seconds, kept = data_layer(run)
        print(f"{name} data layer: every step read in {seconds:.2f} s, the run then holds {kept:.2f} MiB", flush=True)
    if args.data_only:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
        return
    driver = browser()
    try:
        for name, run in (("1k", small), ("10k", large)):
            process, url = start_ui(run)
            try:
                last = max(int(p.name.split("_", 1)[0]) for p in (run / "index").rglob("*.json"))
                times = page_times(driver, url, last)
                rss, peak = rss_mib(process.pid)
            finally:
                process.terminate()
                process.wait()
            print(f"{name}: DOM ready {times['dom_ready_ms']:.0f} ms, loss chart first drawn "
                  f"{times['first_chart_ms']:.0f} ms, all curves to step {last} drawn {times['all_drawn_ms']:.0f} ms "
                  f"({times['loss_points']} loss points); ui server RSS {rss:.0f} MiB (peak {peak:.0f} MiB)",
                  flush=True)  # fmt: skip
        delays = live_delays(driver, work)
        print(f"live: {len(delays)} steps, written -> drawn p50 {statistics.median(delays):.2f} s, "
              f"p95 {sorted(delays)[int(0.95 * (len(delays) - 1))]:.2f} s, max {max(delays):.2f} s")  # fmt: skip
    finally:
        driver.quit()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
