"""Many jobs back to back on the real compose stack: does its S3 keep everything it is given?

Each job is the demo script (every step saved, ExplodingTensor watching it), submitted once the
previous one has settled (``--parallel N``: once one of the N in flight has). Per job it prints
the final statuses, files written (the job's tensors volume) vs files on S3 (keys, sizes, MD5
ETags), and what the uploader said about S3: its retried S3 errors and "S3 is full" refusals (its
log) and its summary line. At the end: the total time,
the S3 endpoint's memory, open files and the bytes on its data volume.

    python bench/stack_jobs.py                    # 50 jobs of 40 steps
    python bench/stack_jobs.py --jobs 5 --steps 20
    python bench/stack_jobs.py --parallel 3          # on a machine too busy for 50 in a row

Jobs stay on S3 (that is the point: S3 fills up); their containers and volumes are removed once
judged. Exit status 1 when any job lost a file, did not end Completed + NoIssuesFound, or its
uploader met any S3 error.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.e2e.stack import Stack, job_spec, volume_files  # noqa: E402

_S3_ERROR_LINE = re.compile(r"S3 error on|S3 is full")


@dataclass
class JobResult:
    index: int
    name: str
    status: str = ""
    rule_status: str = ""
    written: int = 0
    on_s3: int = 0
    lost: list[str] = field(default_factory=list)
    differing: list[str] = field(default_factory=list)
    s3_errors: int = 0  # uploader log lines: an S3 call failed and was retried
    full_refusals: int = 0
    uploader_summary: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    seconds: float = 0.0
    phases: str = ""  # seconds in each secondary status, then until the rule settled

    @property
    def ok(self) -> bool:
        return (self.status == "Completed" and self.rule_status == "NoIssuesFound" and self.written > 0
                and not self.lost and not self.differing and self.s3_errors == 0)  # fmt: skip

    def line(self) -> str:
        summary = self.uploader_summary
        text = (f"job {self.index:3d} {self.name}: {self.status}/{self.rule_status}, files written {self.written}, "
                f"on S3 {self.on_s3}, lost {len(self.lost)}, differing {len(self.differing)}, "
                f"uploader S3 errors {self.s3_errors} (full {self.full_refusals}), "
                f"puts {summary.get('puts')}, bytes {summary.get('bytes')}, "
                f"{self.seconds:.0f} s ({self.phases})")  # fmt: skip
        if self.lost or self.differing:
            text += f" missing/differing: {(self.lost + self.differing)[:5]}"
        if not self.ok and self.reason:
            text += f" ({self.reason[:300]})"
        return text


def run_job(stack: Stack, index: int, steps: int, step_sleep: float, settle_timeout_s: float) -> JobResult:
    started, started_wall = time.monotonic(), time.time()
    name = f"many-{index:03d}-{uuid.uuid4().hex[:4]}"
    result = JobResult(index, name)
    stack.submit(job_spec(name, lr=0.01, steps=steps, step_sleep=step_sleep))
    job = stack.wait_settled(name, timeout_s=settle_timeout_s)
    written = volume_files(f"tg-{name}-tensors")
    on_s3 = stack.s3_objects(f"jobs/{name}/debug-output")
    result.written, result.on_s3 = len(written), len(on_s3)
    result.lost = sorted(set(written) - set(on_s3))
    result.differing = sorted(k for k in set(written) & set(on_s3) if written[k] != on_s3[k])
    rule = (job.get("rules") or [{}])[0]
    result.status, result.rule_status = job["status"], rule.get("status", "")
    result.reason = job.get("failure_reason") or rule.get("status_details") or ""
    log = stack.logs(name, "uploader")
    result.s3_errors = sum(1 for line in log.splitlines() if _S3_ERROR_LINE.search(line))
    result.full_refusals = sum(1 for line in log.splitlines() if "S3 is full" in line)
    for line in reversed(log.splitlines()):
        if line.startswith("{") and '"uploader"' in line:
            try:
                result.uploader_summary = json.loads(line)
            except ValueError:
                pass
            break
    result.seconds = time.monotonic() - started
    result.phases = _phases(job, started_wall)
    return result


def _phases(job: dict[str, Any], submitted: float) -> str:
    """'Starting 9 s, Training 4 s, Uploading 6 s, settled +3 s': where a job's time went."""
    parts, last_end = [], submitted
    for transition in job.get("secondary_status_transitions", []):
        start, end = transition.get("start_time"), transition.get("end_time")
        if isinstance(start, (int, float)) and isinstance(end, (int, float)):
            parts.append(f"{transition['status']} {end - start:.0f} s")
            last_end = end
    parts.append(f"settled +{time.time() - last_end:.0f} s")
    return ", ".join(parts)


def s3_endpoint_usage(stack: Stack) -> str:
    """The S3 container's resident memory, open files and the bytes used on its data volume."""
    container = stack.compose("ps", "-q", "s3").stdout.strip()
    script = ("grep VmRSS /proc/1/status; echo open files: $(ls /proc/1/fd | wc -l); "
              "df -k /data | tail -1; df -k /tmp | tail -1")  # fmt: skip
    result = subprocess.run(["docker", "exec", container, "sh", "-c", script],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    return " | ".join(line.strip() for line in result.stdout.splitlines())


def remove_job(name: str) -> None:
    from trainguard.services.launchers.docker import DockerLauncher

    try:
        DockerLauncher().remove(name)
    except Exception as error:  # noqa: BLE001 - Stack.down() tries again
        print(f"  (could not remove {name}: {error})", flush=True)


def _terminate(signum: int, frame: Any) -> None:  # noqa: ANN401
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    parser.add_argument("--settle-timeout", type=float, default=600.0, help="seconds a job may take to settle")
    parser.add_argument("--parallel", type=int, default=1,
                        help="jobs in flight at once (1: each submitted once the previous one settled)")
    parser.add_argument("--usage-every", type=int, default=10, help="print the S3 endpoint's usage every N jobs")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _terminate)
    stack = Stack()
    results: list[JobResult] = []
    started = time.monotonic()
    try:
        print(f"bringing up compose project {stack.project} ...", flush=True)
        stack.up()
        print(f"S3 endpoint at start: {s3_endpoint_usage(stack)}", flush=True)
        def one(index: int) -> JobResult:
            result = run_job(stack, index, args.steps, args.step_sleep, args.settle_timeout)
            remove_job(result.name)
            return result

        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            for result in pool.map(one, range(args.jobs)):
                results.append(result)
                print(result.line(), flush=True)
                if len(results) % args.usage_every == 0:
                    print(f"S3 endpoint after {len(results)} jobs: {s3_endpoint_usage(stack)}", flush=True)
    except KeyboardInterrupt:
        print("interrupted: tearing the stack down", flush=True)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if results:
            total = time.monotonic() - started
            bad = [r for r in results if not r.ok]
            print(f"total: {len(results)} jobs in {total:.0f} s ({total / len(results):.1f} s per job, stack start "
                  f"included); {sum(r.written for r in results)} files written, "
                  f"{sum(r.on_s3 for r in results)} on S3, {sum(len(r.lost) for r in results)} lost, "
                  f"{sum(len(r.differing) for r in results)} differing; uploader S3 errors "
                  f"{sum(r.s3_errors for r in results)}; {len(results) - len(bad)} jobs ok, {len(bad)} not",
                  flush=True)  # fmt: skip
            try:
                print(f"S3 endpoint at the end: {s3_endpoint_usage(stack)}", flush=True)
            except Exception as error:  # noqa: BLE001 - the report matters more than this line
                print(f"S3 endpoint usage unavailable: {error}", flush=True)
        stack.down()
    return 0 if results and all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
