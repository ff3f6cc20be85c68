"""Stop latency on the compose stack: faulty step written -> job Stopped, over N faulty jobs.

Each job runs the training image's demo script with a healthy learning rate until ``--fault-step``,
then a far too high one, so the fault arrives while the whole pipeline (training, uploader, rule
container) is already running, as in a real job. ExplodingTensor with the stoptraining action
watches it. Per job:

* t_fault: mtime of the index file of the step the rule fired on (the moment that step was
  written and became visible to the uploader), read from the job's tensor volume;
* detect: t_fault -> the API's ``Stopping`` transition (upload + rule + action);
* stop:   t_fault -> ``Stopped`` (also the training container's SIGTERM and exit);
* upload lag: the uploader's own percentiles (upload done - file mtime) over every file of the job.

It brings up its own compose project (docker-compose.yml, free loopback ports) and removes it,
unless ``--api URL --token T --s3 URL`` point at a running stack. Jobs run one at a time (2 cores).

    python bench/stop_latency.py --jobs 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.docker_env import BASE_IMAGE  # noqa: E402
from tests.e2e.stack import DEMO, Stack  # noqa: E402


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _index_mtime(volume: str, step: int) -> float:
    path = f"/t/index/{step // 1000:09d}/{step:012d}_worker_0.json"
    result = subprocess.run(
        ["docker", "run", "--rm", "-v", f"{volume}:/t:ro", BASE_IMAGE, "stat", "-c", "%.9Y", path],
        capture_output=True, text=True, timeout=60, check=True,
    )
    return float(result.stdout.strip())


def _transition(job: dict, status: str) -> float:
    return next(t["start_time"] for t in job["secondary_status_transitions"] if t["status"] == status)


def _uploader_summary(stack: Stack, name: str, timeout_s: float = 60) -> dict:
    """The uploader's closing JSON line (it may still be on its last pass when the job is Stopped)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for line in reversed(stack.logs(name, "uploader").splitlines()):
            if line.startswith("{") and '"uploader"' in line:
                return json.loads(line)
        if time.monotonic() > deadline:
            return {}
        time.sleep(0.5)


def run_job(stack: Stack, fault_step: int, step_sleep: float) -> dict:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    stack.submit({
        "name": name,
        "command": [*DEMO, "--steps", "2000", "--step-sleep", str(step_sleep), "--fault-step", str(fault_step),
                    "--fault-lr", "5"],
        "hook_config": {"HookParameters": {"save_interval": "1"}},
        "resources": {"cpus": 1.0, "memory_mb": 2048},
        "rules": [{"rule": "ExplodingTensor", "actions": [{"name": "stoptraining"}]}],
    })  # fmt: skip
    job = stack.wait_settled(name, timeout_s=300)
    if job["status"] != "Stopped" or not job["rules"][0]["findings"]:
        raise RuntimeError(f"{name} ended {job['status']} without a finding: {json.dumps(job)[:2000]}")
    step = job["rules"][0]["findings"][0]["step"]
    t_fault = _index_mtime(f"tg-{name}-tensors", step)
    uploader = _uploader_summary(stack, name)
    return {
        "job": name,
        "fault_step": step,
        "detect_s": _transition(job, "Stopping") - t_fault,
        "stop_s": _transition(job, "Stopped") - t_fault,
        "upload_lag_p50_s": uploader.get("lag_p50_s"),
        "upload_lag_p95_s": uploader.get("lag_p95_s"),
        "uploaded_files": uploader.get("files"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--fault-step", type=int, default=40, help="step at which the learning rate jumps")
    parser.add_argument("--step-sleep", type=float, default=0.05, help="seconds per training step beyond compute")
    parser.add_argument("--json", help="also write the per-job rows to this file")
    args = parser.parse_args()

    stack = Stack()
    print(f"bringing up compose project {stack.project} ...", flush=True)
    stack.up()
    rows = []
    try:
        for index in range(args.jobs):
            row = run_job(stack, args.fault_step, args.step_sleep)
            rows.append(row)
            print(
                f"job {index + 1}/{args.jobs} {row['job']}: fault at step {row['fault_step']}, "
                f"Stopping after {row['detect_s']:.2f} s, Stopped after {row['stop_s']:.2f} s, "
                f"upload lag p50 {row['upload_lag_p50_s']} s p95 {row['upload_lag_p95_s']} s",
                flush=True,
            )
    finally:
        stack.down()
    detect = [r["detect_s"] for r in rows]
    stop = [r["stop_s"] for r in rows]
    lag50 = [r["upload_lag_p50_s"] for r in rows if r["upload_lag_p50_s"] is not None]
    lag95 = [r["upload_lag_p95_s"] for r in rows if r["upload_lag_p95_s"] is not None]
    print()
    print(f"| metric (n={len(rows)} jobs) | p50 | p95 | max |")
    print("|---|---|---|---|")

    def row(label: str, values: list[float]) -> None:
        print(f"| {label} | {statistics.median(values):.2f} | {_percentile(values, 0.95):.2f} | {max(values):.2f} |")

    row("fault step written -> Stopping (s)", detect)
    row("fault step written -> Stopped (s)", stop)
    if lag50:
        row("upload lag, per-job p50 (s)", lag50)
        row("upload lag, per-job p95 (s)", lag95)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
