"""What job containers' CPU weight (TRAINGUARD_JOB_CPU_SHARES) costs the API and the jobs.

On the real compose stack, for each weight: ``--jobs`` busy job containers at that weight (what
other jobs' training does), ``--neighbours`` busy containers at Docker's default weight 1024 (other
workloads on the host: another stack, a build), and one probe job at that weight doing a fixed
amount of work per step. Meanwhile the API's ``/health`` is timed from the host. Printed per
weight: the probe's steps/s (vs alone on an idle stack), and /health p50/p95/max.

    python bench/cpu_shares.py                             # weights 2,64,256,512,1024
    python bench/cpu_shares.py --shares 2,256 --seconds 10

Every container it starts carries the label trainguard.bench=cpu-shares and is removed at the end.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.e2e.stack import Stack  # noqa: E402

LABEL = "trainguard.bench=cpu-shares"
# One step: a fixed pure-Python loop (about 10 ms of CPU on an idle core here); the probe prints
# how many steps it finished in its time.
PROBE = (
    "import time\n"
    "end = time.monotonic() + {seconds}\n"
    "steps = 0\n"
    "while time.monotonic() < end:\n"
    "    sum(i * i for i in range(20000))\n"
    "    steps += 1\n"
    "print(steps / {seconds})\n"
)


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, timeout=120).stdout.strip()


def _busy(image: str, shares: int) -> str:
    return _docker("run", "-d", "--label", LABEL, "--cpu-shares", str(shares), "--entrypoint", "python", image,
                   "-c", "while True: pass")  # fmt: skip


def _probe(image: str, shares: int, seconds: float) -> float:
    output = _docker("run", "--rm", "--label", LABEL, "--cpu-shares", str(shares), "--entrypoint", "python", image,
                     "-c", PROBE.format(seconds=seconds))  # fmt: skip
    return float(output.splitlines()[-1])


def _health_latencies(url: str, stop: threading.Event, interval_s: float = 0.05) -> list[float]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    latencies: list[float] = []
    while not stop.is_set():
        started = time.perf_counter()
        with opener.open(f"{url}/health", timeout=30) as response:
            response.read()
        latencies.append((time.perf_counter() - started) * 1000)
        stop.wait(interval_s)
    return latencies


def measure(stack: Stack, image: str, shares: int | None, jobs: int, neighbours: int, seconds: float) -> dict:
    """shares None: the probe alone at 1024, nothing busy (the baseline)."""
    started: list[str] = []
    try:
        if shares is not None:
            started += [_busy(image, shares) for _ in range(jobs)]
            started += [_busy(image, 1024) for _ in range(neighbours)]
            time.sleep(2)  # let them spin up
        stop = threading.Event()
        latencies: list[float] = []
        timer = threading.Thread(target=lambda: latencies.extend(_health_latencies(stack.url, stop)), daemon=True)
        timer.start()
        rate = _probe(image, shares or 1024, seconds)
        stop.set()
        timer.join(timeout=60)
    finally:
        if started:
            subprocess.run(["docker", "rm", "-f", *started], capture_output=True, timeout=120)
    ordered = sorted(latencies)
    return {
        "shares": shares, "steps_per_s": rate, "health_n": len(ordered),
        "health_p50_ms": statistics.median(ordered) if ordered else None,
        "health_p95_ms": ordered[int(0.95 * (len(ordered) - 1))] if ordered else None,
        "health_max_ms": ordered[-1] if ordered else None,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shares", default="2,64,256,512,1024")
    parser.add_argument("--jobs", type=int, default=4, help="busy job containers beside the probe")
    parser.add_argument("--neighbours", type=int, default=2, help="busy containers at the default weight")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--image", default="trainguard-training:local")
    args = parser.parse_args()
    weights = [int(w) for w in args.shares.split(",") if w]
    stack = Stack()
    try:
        print(f"bringing up compose project {stack.project} ...", flush=True)
        stack.up()
        load = Path("/proc/loadavg").read_text().split()[:3]
        print(f"host load average {' '.join(load)}; {args.jobs} busy jobs + {args.neighbours} busy neighbours "
              f"at 1024; probe {args.seconds:.0f} s", flush=True)  # fmt: skip
        baseline = measure(stack, args.image, None, 0, 0, args.seconds)
        print("| job cpu_shares | probe steps/s | vs alone | /health p50 | p95 | max | n |", flush=True)
        print("|---|---|---|---|---|---|---|", flush=True)

        def row(result: dict, label: str) -> None:
            print(f"| {label} | {result['steps_per_s']:.1f} | {result['steps_per_s'] / baseline['steps_per_s']:.2f}x | "
                  f"{result['health_p50_ms']:.1f} ms | {result['health_p95_ms']:.1f} ms | "
                  f"{result['health_max_ms']:.1f} ms | {result['health_n']} |", flush=True)  # fmt: skip

        row(baseline, "alone, nothing busy")
        for weight in weights:
            row(measure(stack, args.image, weight, args.jobs, args.neighbours, args.seconds), str(weight))
    finally:
        subprocess.run(["docker", "rm", "-f", *_docker("ps", "-aq", "--filter", f"label={LABEL}").split()],
                       capture_output=True, timeout=120)  # fmt: skip
        stack.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
