"""Fault runs on the real compose stack: the API in its container launching jobs through the Docker
proxy, PyTorch training containers, an uploader container copying tensors to the stack's S3
endpoint and a rule-runner container per rule. Each run is one healthy job (the demo script, every
step saved, ExplodingTensor watching it) with one fault injected mid-run, once at least 10 files
are on S3. Per run it prints files written (the job's tensors volume) vs files on S3 (keys, sizes
and MD5 ETags), the end marker, steps evaluated vs written and the final statuses.

    python bench/chaos_stack.py                         # every fault kind, 5 runs each
    python bench/chaos_stack.py --faults kill-uploader,pause-s3 --runs 2

Faults (nothing is repaired by hand: recovering is the service's job):
  kill-uploader     docker kill of tg-<job>-uploader; the API's reconciler must restart it
  kill-runner       docker kill of the job's rule-runner container; the reconciler must restart it
  restart-api       docker compose restart api (the job must outlive it)
  restart-s3-empty  the s3 service killed and started again; it is moto: its object bytes are
                    unlinked temporary files on the s3-data volume and its index is in memory, so
                    it comes back with no bucket and no object (checked, not assumed)
  pause-s3          docker pause of the s3 container for 5 s, then unpause

Exit status 1 when any file was lost or differs, or any run did not end Completed + NoIssuesFound
with every written step evaluated and the end marker on S3. tests/e2e/test_stack_faults.py runs
one short run per fault kind through :func:`one_run`.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.e2e.stack import Stack, job_spec, volume_files  # noqa: E402

FAULTS = ("kill-uploader", "kill-runner", "restart-api", "restart-s3-empty", "pause-s3")
END_MARKER = "training_job_end.ts"
FILES_BEFORE_FAULT = 10
PAUSE_S = 5.0
SENTINEL = "chaos-sentinel"  # a bucket only this script creates: gone after the restart = S3 came back empty
T = TypeVar("T")


@dataclass
class RunResult:
    fault: str
    run: int
    job_name: str
    injected_mid_run: bool = False  # False: training had ended before the fault (the run proves less)
    written: int = 0
    on_s3: int = 0
    lost: list[str] = field(default_factory=list)  # in the volume, not on S3
    differing: list[str] = field(default_factory=list)  # on S3 with another size or MD5
    end_marker: bool = False
    steps_written: int = 0  # index files in the volume: complete steps a rule can read
    steps_evaluated: int = 0  # the rule's last_evaluated_step + 1
    job_status: str = ""
    rule_status: str = ""
    reason: str = ""
    fault_note: str = ""  # what the injection observed (e.g. the restarted S3 really was empty)
    fault_verified: bool = True  # False: the fault was not what it claims (S3 kept data, nobody restarted)
    seconds: float = 0.0
    phases: str = ""  # seconds to the first files on S3, to the fault, to the settled job

    @property
    def ok(self) -> bool:
        """The healthy job's only right ending, whatever the fault."""
        return (self.fault_verified and not self.lost and not self.differing and self.end_marker
                and self.job_status == "Completed"
                and self.rule_status == "NoIssuesFound" and 0 < self.steps_written == self.steps_evaluated)  # fmt: skip

    def line(self) -> str:
        text = (f"{self.fault:16s} run {self.run}: files written {self.written:4d}, on S3 {self.on_s3:4d}, "
                f"lost {len(self.lost)}, differing {len(self.differing)}, end marker on S3 {self.end_marker}, "
                f"steps evaluated {self.steps_evaluated:3d}/{self.steps_written:3d} written, "
                f"job {self.job_status}, rule {self.rule_status}, files/fault/settled at {self.phases}")  # fmt: skip
        if not self.injected_mid_run:
            text += " [fault landed after training ended]"
        if self.fault_note:
            text += f" [{self.fault_note}]"
        if self.lost or self.differing:
            text += f" missing/differing: {(self.lost + self.differing)[:5]}"
        if not self.ok and self.reason and self.reason not in self.fault_note:
            text += f" ({self.reason[:200]})"
        return text


def _wait(predicate: Callable[[], T], timeout_s: float, interval_s: float = 0.5) -> T | None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
        except Exception:  # noqa: BLE001 - the API or S3 may be down on purpose during a fault
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(interval_s)


def _docker(*args: str, timeout_s: float = 120) -> str:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def _job_container(job_name: str, role_prefix: str) -> str:
    """The container of a job component, found by the launcher's labels (not by a guessed name:
    a rule's role is ``rule:<configuration name>``, sanitised into the container name)."""
    lines = _docker("ps", "-a", "--filter", f"label=trainguard.job={job_name}",
                    "--format", '{{.Names}}\t{{.Label "trainguard.role"}}').splitlines()  # fmt: skip
    names = [name for name, _, role in (line.partition("\t") for line in lines) if role.startswith(role_prefix)]
    if len(names) != 1:
        raise RuntimeError(f"job {job_name}: expected one {role_prefix!r} container, found {names}")
    return names[0]


def _service_container(stack: Stack, service: str) -> str:
    return stack.compose("ps", "-q", service).stdout.strip()


def _training_running(job_name: str) -> bool:
    return _docker("inspect", "-f", "{{.State.Running}}", _job_container(job_name, "training")) == "true"


def inject(stack: Stack, fault: str, job_name: str) -> str:
    """Inject one fault; returns a note on what was observed (empty when nothing to say)."""
    if fault == "kill-uploader":
        _docker("kill", _job_container(job_name, "uploader"))
    elif fault == "kill-runner":
        _docker("kill", _job_container(job_name, "rule:"))
    elif fault == "restart-api":
        stack.compose("restart", "api")
        stack.compose("up", "-d", "--wait", "api")  # healthy again before the run is judged
    elif fault == "restart-s3-empty":
        # moto keeps its index in memory and its object bytes in unlinked temporary files (on the
        # s3-data volume), so a restart empties it; checked below, so a persistent endpoint
        # cannot quietly turn this fault into a plain restart.
        container = _service_container(stack, "s3")
        mounts = _docker("inspect", "-f", "{{range .Mounts}}{{.Type}}:{{.Destination}} {{end}}", container)
        stack.s3().create_bucket(Bucket=SENTINEL)
        # kill + start, not `restart`: SIGKILL, as a crash.
        stack.compose("kill", "s3")
        stack.compose("start", "s3")
        buckets = _wait(lambda: {b["Name"] for b in stack.s3().list_buckets().get("Buckets", [])} | {"-"}, 60)
        # The job's own bucket may already be back (its uploader re-creates it within a second),
        # so emptiness is read from a bucket nobody re-creates.
        empty = buckets is not None and SENTINEL not in buckets
        return ("S3 came back empty" if empty else "S3 did NOT come back empty") + (
            f"; s3 mounts: {mounts.strip()}" if mounts.strip() else ""
        )
    elif fault == "pause-s3":
        container = _service_container(stack, "s3")
        _docker("pause", container)
        try:
            time.sleep(PAUSE_S)
        finally:
            _docker("unpause", container)
    else:
        raise ValueError(f"unknown fault {fault!r}")
    return ""


def one_run(
    stack: Stack, fault: str, index: int, *, steps: int, step_sleep: float, settle_timeout_s: float = 420
) -> RunResult:
    """One job with one fault, judged on what the volume, S3 and the API say at the end."""
    started = time.monotonic()
    name = f"chaos-{fault}-{index}-{uuid.uuid4().hex[:4]}"
    prefix = f"jobs/{name}/debug-output"
    result = RunResult(fault, index, name)
    stack.submit(job_spec(name, lr=0.01, steps=steps, step_sleep=step_sleep))
    if not _wait(lambda: len(stack.s3_objects(prefix)) >= FILES_BEFORE_FAULT, 300):
        raise RuntimeError(f"{name}: fewer than {FILES_BEFORE_FAULT} files on S3 after 300 s")
    t_files = time.monotonic() - started
    result.injected_mid_run = _training_running(name)
    try:
        result.fault_note = inject(stack, fault, name)
        result.fault_verified = "NOT" not in result.fault_note
    except (RuntimeError, AssertionError, subprocess.TimeoutExpired) as error:
        # The stack did not take the fault as it should (a service not healthy again): a failed
        # run to report, and the job is still judged; the other runs go on.
        result.fault_note, result.fault_verified = f"fault injection failed: {str(error)[-300:]}", False
        _wait(lambda: stack.job(name), 120)  # the API may still be coming back
    t_fault = time.monotonic() - started
    # Settled: job ended and no rule InProgress/Stopping (the API may still be coming back).
    job = _wait(lambda: _settled(stack, name), settle_timeout_s, 1.0) or stack.job(name)
    written = volume_files(f"tg-{name}-tensors")
    on_s3 = stack.s3_objects(prefix)
    result.written, result.on_s3 = len(written), len(on_s3)
    result.lost = sorted(set(written) - set(on_s3))
    result.differing = sorted(k for k in set(written) & set(on_s3) if written[k] != on_s3[k])
    result.end_marker = END_MARKER in on_s3
    result.steps_written = sum(1 for key in written if key.startswith("index/"))
    rule = (job.get("rules") or [{}])[0]
    last = rule.get("last_evaluated_step")
    result.steps_evaluated = last + 1 if isinstance(last, int) else 0
    result.job_status, result.rule_status = job["status"], rule.get("status", "")
    result.reason = job.get("failure_reason") or rule.get("status_details") or ""
    result.seconds = time.monotonic() - started
    result.phases = f"{t_files:.0f}/{t_fault:.0f}/{result.seconds:.0f} s"
    if fault in ("kill-uploader", "kill-runner"):
        result.fault_note = _who_restarted(stack, name, "uploader" if fault == "kill-uploader" else "rule:")
        result.fault_verified = result.fault_note == "restarted by the reconciler"
    return result


def _who_restarted(stack: Stack, name: str, role_prefix: str) -> str:
    """Whether the API's reconciler restarted the killed container (its log says so) or Docker's
    restart policy did (RestartCount): the suite is about the service's own supervision."""
    api_log = stack.compose("logs", "--no-color", "api").stdout
    by_reconciler = any(name in line and "restarting it" in line for line in api_log.splitlines())
    count = _docker("inspect", "-f", "{{.RestartCount}}", _job_container(name, role_prefix))
    return f"restarted by the {'reconciler' if by_reconciler else 'engine' if count != '0' else 'nobody'}"


def _settled(stack: Stack, name: str) -> dict[str, Any] | None:
    job = stack.job(name)
    rules_done = all(r["status"] not in ("InProgress", "Stopping") for r in job.get("rules", []))
    return job if job["status"] in ("Completed", "Failed", "Stopped") and rules_done else None


def remove_job(name: str) -> None:
    """Free the job's containers and volume once judged (25 runs' volumes add up on a small disk)."""
    from trainguard.services.launchers.docker import DockerLauncher

    try:
        DockerLauncher().remove(name)
    except Exception as error:  # noqa: BLE001 - Stack.down() tries again
        print(f"  (could not remove {name}: {error})", flush=True)


def summary(results: list[RunResult]) -> str:
    lost = sum(len(r.lost) for r in results)
    differing = sum(len(r.differing) for r in results)
    wrong = sum(not r.ok for r in results)
    return (f"total: {len(results)} runs, {sum(r.written for r in results)} files written, {lost} lost, "
            f"{differing} differing; {len(results) - wrong} runs in the expected final state, {wrong} not")  # fmt: skip


def _terminate(signum: int, frame: Any) -> None:  # noqa: ANN401
    raise KeyboardInterrupt  # SIGTERM tears the stack down like Ctrl-C does


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, of: " + ", ".join(FAULTS))
    parser.add_argument("--runs", type=int, default=5, help="runs per fault kind")
    # 200 steps at 0.1 s: ~25 s of training, so a fault after the first 10 files lands mid-run
    # even when container start-up and the first uploads are slow on a busy machine.
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-sleep", type=float, default=0.1)
    parser.add_argument("--keep-jobs", action="store_true", help="do not remove each job after judging it")
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        parser.error(f"unknown fault(s): {', '.join(sorted(unknown))}")
    signal.signal(signal.SIGTERM, _terminate)
    stack = Stack()
    results: list[RunResult] = []
    try:
        print(f"bringing up compose project {stack.project} ...", flush=True)
        stack.up()
        for fault in faults:
            for index in range(args.runs):
                result = one_run(stack, fault, index, steps=args.steps, step_sleep=args.step_sleep)
                results.append(result)
                print(result.line(), flush=True)
                if not args.keep_jobs:
                    remove_job(result.job_name)
    except KeyboardInterrupt:
        print("interrupted: tearing the stack down", flush=True)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip the teardown
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if results:
            print(summary(results), flush=True)
        stack.down()
    return 0 if results and all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
