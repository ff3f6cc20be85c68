"""Fault runs against the real service (local launcher): each run is one job whose training (real
PyTorch, 300 steps, every step saved) is followed by an uploader into a real S3 endpoint (moto) and
by a rule runner reporting to the control API; one fault is injected mid-run. Per run it prints
files written vs files on S3, steps evaluated (datapoints the API holds) and the final statuses.

    python bench/chaos.py                      # every fault kind, 5 runs each
    python bench/chaos.py --faults kill-uploader,restart-s3-empty --runs 2

Faults: kill-uploader (kill -9 of the uploader process), kill-runner (kill -9 of the rule runner),
restart-api (kill -9 of the API, 3 s down, restarted on the same database), restart-s3-empty (the S3
endpoint killed and restarted with nothing in it), pause-s3 (SIGSTOP of the endpoint for 5 s),
no-capture (a job whose command captures nothing: the run must still end, end marker on S3),
disk-full (the training's capture directory is a small tmpfs, filled to the last byte mid-run by a
hidden ballast file and left full: training must go on without capture, every step written before
must reach S3 and be evaluated, the job must end; needs root for ``mount``).
The uploader component is added to the local job the way the Docker plan has one (see
tests/reliability/test_supervision.py); the API's reconciler supervises it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainguard.services.launchers.base import ComponentSpec, JobLaunch  # noqa: E402
from trainguard.services.launchers.local import LocalLauncher  # noqa: E402

from tests.reliability.faults import (  # noqa: E402
    RestartableS3,
    fill_disk,
    local_run_files,
    mount_small_disk,
    s3_run_files,
    unmount,
    uploader_command,
)  # fmt: skip
from tests.s3_server import DUMMY_CREDENTIALS  # noqa: E402
from tests.services.conftest import ApiServer, _stop_local_jobs, training_command  # noqa: E402

FAULTS = ("kill-uploader", "kill-runner", "restart-api", "restart-s3-empty", "pause-s3", "no-capture", "disk-full")
STEPS = 300  # 15 s of training at 0.05 s a step: the fault lands mid-run even on a busy machine
RULE = "tests.services.rules_for_tests:LossAboveThreshold"
FINAL_RULE = {"NoIssuesFound", "IssuesFound", "Error", "Stopped"}


def _wait(predicate, timeout: float, interval: float = 0.2):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


def _kill_command(component_dir: Path) -> bool:
    """kill -9 of the component's process (not the launcher's wrapper); False when it already ended."""
    wrapper = int((component_dir / "pid").read_text().split()[0])
    try:
        children = Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split()
    except OSError:
        return False
    if not children:
        return False
    os.kill(int(children[0]), signal.SIGKILL)
    return True


def training_capture_stopped(component_dir: Path) -> bool:
    """Whether the training's log has the hook's fail-open line (capture disabled, training goes on)."""
    log = component_dir / "output.log"
    return log.exists() and "capture disabled" in log.read_text(errors="replace")


def _exit_code(component_dir: Path) -> int | None:
    try:
        return int((component_dir / "exit_code").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def one_run(fault: str, index: int, work: Path, s3: RestartableS3) -> dict:
    api = ApiServer(work / f"{fault}-{index}", {})
    api.data_dir.mkdir(parents=True)
    api.start()
    name = f"chaos-{index}"
    run_dir = api.data_dir / "jobs" / name / "debug-output"
    if fault == "disk-full":
        mount_small_disk(run_dir)
    try:
        command = (["python", "-c", "print('nothing captured')"] if fault == "no-capture"
                   else training_command("--steps", str(STEPS), "--step-seconds", "0.05"))  # fmt: skip
        spec = {"name": name, "command": command, "hook_config": {"HookParameters": {"save_interval": "1"}},
                "rules": [{"rule": RULE, "name": "Loss", "parameters": {"threshold": 1e30}}]}  # fmt: skip
        status, body = api.request("POST", "/v1/jobs", spec)
        if status != 201:
            raise RuntimeError(f"create: {status} {body}")
        prefix = f"{fault}-{index}/debug-output"
        uploader = uploader_command(run_dir, f"s3://runs/{prefix}", s3.endpoint)
        LocalLauncher(api.data_dir / "local").start(
            JobLaunch(name, (ComponentSpec("uploader", "", tuple(uploader), dict(DUMMY_CREDENTIALS)),))
        )
        if fault != "no-capture" and not _wait(
            lambda: (api.job(name)["rules"][0].get("last_evaluated_step") or -1) >= 5
            and len(s3_run_files(s3.client(), "runs", prefix)) >= 10, 120,
        ):  # fmt: skip
            raise RuntimeError(f"{fault} run {index}: no evaluations and uploads within 120 s")
        injected = time.monotonic()
        injected_ok = True
        if fault == "kill-uploader":
            injected_ok = _kill_command(api.data_dir / "local" / name / "uploader")
        elif fault == "kill-runner":
            injected_ok = _kill_command(api.data_dir / "local" / name / "rule--Loss")
        elif fault == "restart-api":
            api.kill(signal.SIGKILL)
            time.sleep(3)
            api.start()
        elif fault == "restart-s3-empty":
            s3.restart_empty(down_s=0.5)
        elif fault == "pause-s3":
            s3.process.send_signal(signal.SIGSTOP)
            time.sleep(5)
            s3.process.send_signal(signal.SIGCONT)
        elif fault == "disk-full":
            fill_disk(run_dir)
        job = _wait(lambda: (j := api.job(name))["status"] != "InProgress"
                    and j["rules"][0]["status"] in FINAL_RULE and j, 240) or api.job(name)  # fmt: skip
        written = local_run_files(run_dir)
        on_s3 = s3_run_files(s3.client(), "runs", prefix)
        with sqlite3.connect(api.data_dir / "trainguard.db") as db:
            steps = {row[0] for row in db.execute(
                "SELECT step FROM metric_data WHERE job_name=? AND metric_name='RuleIssuesFound'", (name,))}  # fmt: skip
        return {
            # complete steps written (an index is written after its event file): what rules can evaluate
            "steps_written": sum(1 for key in written if key.startswith("index/")),
            "fault": fault if injected_ok else f"{fault} (too late)", "run": index, "written": len(written), "on_s3": len(on_s3),
            "lost": sorted(set(written) - set(on_s3)), "end_marker_on_s3": "training_job_end.ts" in on_s3,
            "steps_evaluated": len(steps), "job": job["status"], "rule": job["rules"][0]["status"],
            "seconds_after_fault": round(time.monotonic() - injected, 1),
            "training_exit": _exit_code(api.data_dir / "local" / name / "training"),
            "capture_disabled_logged": training_capture_stopped(api.data_dir / "local" / name / "training"),
            "reason": (job.get("failure_reason") or job["rules"][0].get("status_details") or "")[:160],
        }  # fmt: skip
    finally:
        api.kill(signal.SIGTERM)
        _stop_local_jobs(api.data_dir / "local")
        if fault == "disk-full":
            unmount(run_dir)


def _expected_final_state(row: dict) -> bool:
    """Every job Completed with its end marker on S3 and training exiting 0, and per fault kind:"""
    if row["job"] != "Completed" or not row["end_marker_on_s3"] or row["training_exit"] != 0:
        return False
    if row["fault"] == "no-capture":  # rules end as not evaluated (Error), never NoIssuesFound
        return row["rule"] in FINAL_RULE - {"NoIssuesFound"}
    if row["fault"] == "disk-full":
        # Training goes on without capture (the hook's one fail-open line), every complete step
        # written before the disk filled is evaluated (fewer than STEPS is the point), and the
        # verdict says the rest was not: RuleNotEvaluated naming where capture stopped.
        return (row["rule"] == "Error" and "capture stopped early" in row["reason"] and row["capture_disabled_logged"]
                and 0 < row["steps_evaluated"] == row["steps_written"] < STEPS)  # fmt: skip
    return row["rule"] == "NoIssuesFound" and row["steps_evaluated"] == STEPS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, of: " + ", ".join(FAULTS))
    parser.add_argument("--runs", type=int, default=5, help="runs per fault kind")
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        parser.error(f"unknown fault(s): {', '.join(sorted(unknown))}")
    for key, value in {**DUMMY_CREDENTIALS, "NO_PROXY": "127.0.0.1,localhost"}.items():
        os.environ[key] = value
    work = Path(tempfile.mkdtemp(prefix="trainguard-chaos-"))
    s3 = RestartableS3(work / "moto.log")
    s3.start()
    rows = []
    try:
        for fault in faults:
            for index in range(args.runs):
                if s3.process is None or s3.process.poll() is not None:
                    s3.start()
                s3.client().create_bucket(Bucket="runs")  # again after a restart-empty run
                row = one_run(fault, index, work, s3)
                rows.append(row)
                print(f"{row['fault']:17s} run {row['run']}: files written {row['written']:4d}, on S3 {row['on_s3']:4d}, "
                      f"lost {len(row['lost'])}, end marker on S3 {row['end_marker_on_s3']}, "
                      f"steps evaluated {row['steps_evaluated']:3d}/{row['steps_written']:3d} written, "
                      f"job {row['job']}, rule {row['rule']}, training exit {row['training_exit']}"
                      + (f", capture-disabled logged {row['capture_disabled_logged']}" if fault == "disk-full" else "")
                      + (f" ({row['reason']})" if row['rule'] not in ('NoIssuesFound',) or row['job'] != 'Completed' else ""),
                      flush=True)  # fmt: skip
    finally:
        s3.kill()
    lost = sum(len(r["lost"]) for r in rows)
    wrong = [r for r in rows if not _expected_final_state(r)]
    print(f"total: {len(rows)} runs, {sum(r['written'] for r in rows)} files written, {lost} lost; "
          f"{len(rows) - len(wrong)} runs in the expected final state, {len(wrong)} not")
    return 0 if lost == 0 and not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
