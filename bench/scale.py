"""Scale figures on a local multi-node Ray cluster: N concurrent jobs x R rules through the API.

Starts, all on this machine: a moto S3 server (subprocess, its request log counted), a Ray
cluster (``ray.cluster_utils.Cluster``: a head that runs nothing, a node offering ``training``,
a node offering ``rules``; logical resources sized so every job fits at once), and the control
API with ``TRAINGUARD_LAUNCHER=ray`` (``bench/scale_api.py``: the API unchanged, its SQL commits
counted). Then submits ``--jobs`` small PyTorch trainings at once (``tests/services/train_script.py``),
each with ``--rules`` rules (the tests' ``LossAboveThreshold``) and an S3 output, so the uploader
copies the capture to S3 and the rule runners read it from there. Every other job is faulty (its
learning rate blows up): its first rule carries a ``stoptraining`` action.

On Ray a job's rules run as one Ray job, one rule-runner process per job (the launcher's rules
group), so "rule-runner processes" are per job; on the local launcher they are per rule.

Measures submit-to-running (POST -> training component Running, and -> first saved step on
disk), detection-to-Stopped (rule seen IssuesFound -> job seen Stopped; also from the API's own
timestamps), API and rule-runner RSS (peak), rule-runner CPU seconds per evaluated step, S3
requests per saved step, API database writes per job-minute; then a paper estimate for
100 jobs x 20 rules from those per-unit costs.

    nice -n 10 python bench/scale.py --jobs 20 --rules 5
    python bench/scale.py --tiny            # 2 jobs x 2 rules, what tests/bench/test_scale_bench.py runs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load_api import Client, _free_port, percentile  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TRAIN_SCRIPT = REPO / "tests" / "services" / "train_script.py"
CUSTOM_RULE = "tests.services.rules_for_tests:LossAboveThreshold"
TERMINAL = ("Completed", "Failed", "Stopped")
S3_REQUEST = re.compile(r'"(GET|PUT|POST|HEAD|DELETE) ')


def _wait(predicate, timeout: float, what: str, interval: float = 0.5) -> Any:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def start_s3(work: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = _free_port()
    log = work / "s3.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=open(log, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115 - the child keeps it
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    import boto3

    client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")

    def up() -> bool:
        try:
            client.create_bucket(Bucket="scale")
            return True
        except Exception:  # noqa: BLE001 - not up yet
            return False

    _wait(up, 60, "the moto S3 server")
    return process, url, log


def s3_requests(log: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for match in S3_REQUEST.finditer(log.read_text(errors="replace")):
        counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    return counts


def _add_node(cluster: Any, attempts: int = 3, **node_args: Any) -> None:
    """Ray gives a starting node a fixed 30 s to register with the GCS; on a loaded machine it can
    miss that ("The current node timed out during startup", seen twice in CI runs beside other
    work): try again rather than fail the whole measurement."""
    for attempt in range(1, attempts + 1):
        try:
            cluster.add_node(**node_args)
            return
        except Exception as error:  # noqa: BLE001 - Ray raises a bare Exception for this
            if attempt == attempts or "timed out during startup" not in str(error):
                raise
            print(f"scale: a Ray node missed its start-up window ({error}); starting it again", file=sys.stderr)


def start_ray(jobs: int, rules: int) -> tuple[Any, str]:
    from ray.cluster_utils import Cluster

    from trainguard.services.launchers.ray import RayLauncher

    port = _free_port()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": True, "dashboard_host": "127.0.0.1",
                        "dashboard_port": port},
    )  # fmt: skip
    # Logical resources sized so every job's components fit at once; the machine's real cores are
    # what they are (the figures say how many).
    _add_node(cluster, num_cpus=jobs, resources={"training": jobs})
    _add_node(cluster, num_cpus=jobs, resources={"rules": jobs * rules})
    cluster.wait_for_nodes()
    address = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            RayLauncher(address).jobs()
            return True
        except Exception:  # noqa: BLE001 - not up yet
            return False

    _wait(answers, 120, "the Ray job API", interval=1.0)
    # The job API answers before its agents can take a submission ("No available agent to submit
    # job"): a probe job that runs to the end means the launcher's submissions will be accepted.
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address)

    def probe_ran() -> bool:
        try:
            submission = client.submit_job(entrypoint="true", entrypoint_num_cpus=0)
            return bool(_wait(lambda: client.get_job_status(submission).is_terminal() and
                              client.get_job_status(submission) == JobStatus.SUCCEEDED, 60, "the probe job"))
        except (Exception, SystemExit):  # noqa: BLE001 - agents not up yet: try again
            return False

    _wait(probe_ran, 180, "the Ray job agents to take a job", interval=2.0)
    return cluster, address


def start_api(work: Path, token: str, ray_address: str, s3_url: str) -> tuple[subprocess.Popen[bytes], Client, Path]:
    port = _free_port()
    counts = work / "db_counts.json"
    environment = {
        **os.environ,
        "TRAINGUARD_API_TOKEN": token,
        "TRAINGUARD_DATA_DIR": str(work / "data"),
        "TRAINGUARD_LAUNCHER": "ray",
        "RAY_ADDRESS": ray_address,
        "S3_ENDPOINT_URL": s3_url,
        "TRAINGUARD_STOP_GRACE_SECONDS": "5",
        "TRAINGUARD_PORT": str(port),
        "TRAINGUARD_SCALE_COUNTS": str(counts),
        "TRAINGUARD_RULE_MODULES": "tests.services.rules_for_tests",  # the custom rule the jobs name
        "NO_PROXY": "127.0.0.1,localhost",
    }
    process = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "scale_api.py"), "--log-level", "warning"],
        cwd=REPO, env=environment, stdout=open(work / "api.log", "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
    )  # fmt: skip
    client = Client(f"http://127.0.0.1:{port}", token)

    def healthy() -> bool:
        if process.poll() is not None:
            raise SystemExit(f"the API exited with {process.returncode}; see {work / 'api.log'}")
        return client.call("GET", "/health")[0] == 200

    _wait(healthy, 90, "the API's /health", interval=0.2)
    return process, client, counts


def job_spec(name: str, rules: int, faulty: bool, steps: int, step_seconds: float, blowup_at: int) -> dict[str, Any]:
    command = [sys.executable, str(TRAIN_SCRIPT), "--steps", str(steps), "--step-seconds", str(step_seconds)]
    if faulty:
        command += ["--blowup-at", str(blowup_at)]
    rule_list = []
    for index in range(rules):
        rule: dict[str, Any] = {"rule": CUSTOM_RULE, "name": f"Loss{index}", "parameters": {"threshold": 1000 + index}}
        if index == 0:
            rule["actions"] = [{"name": "stoptraining"}]
        rule_list.append(rule)
    return {
        "name": name,
        "command": command,
        "hook_config": {"HookParameters": {"save_interval": "1"}, "S3OutputPath": "s3://scale"},
        "rules": rule_list,
    }


class Sampler:
    """Peak RSS of the API and of every rule-runner process, and each runner's last CPU seconds."""

    def __init__(self, api_pid: int, data_dir: Path) -> None:
        self.api = psutil.Process(api_pid)
        self.data_dir = str(data_dir)  # this run's runners name it in their environment, others' do not
        self.api_peak = 0
        self.runner_peak: dict[int, int] = {}
        self.runner_cpu: dict[int, float] = {}
        self.runner_processes: dict[int, psutil.Process] = {}

    def sample(self) -> None:
        try:
            self.api_peak = max(self.api_peak, self.api.memory_info().rss)
        except psutil.Error:
            pass
        for process in psutil.process_iter(["pid", "cmdline"]):
            cmdline = process.info.get("cmdline") or []
            if "trainguard.services.rule_runner" in cmdline and process.pid not in self.runner_processes:
                try:
                    mine = any(self.data_dir in value for value in process.environ().values())
                except psutil.Error:
                    continue
                if mine:
                    self.runner_processes[process.pid] = process
        for pid, process in list(self.runner_processes.items()):
            try:
                with process.oneshot():
                    rss, times = process.memory_info().rss, process.cpu_times()
            except psutil.Error:
                del self.runner_processes[pid]  # ended: its last sample stands
                continue
            self.runner_peak[pid] = max(self.runner_peak.get(pid, 0), rss)
            self.runner_cpu[pid] = times.user + times.system


def captured_steps(data_dir: Path, job: str) -> set[int]:
    """Steps with a saved file in the job's local capture (file names carry the step number)."""
    steps: set[int] = set()
    for path in (data_dir / "jobs" / job / "debug-output").rglob("*"):
        match = re.match(r"0*(\d+)_", path.name)
        if path.is_file() and match and "events" in path.parts:
            steps.add(int(match.group(1)))
    return steps


def first_capture_time(data_dir: Path, job: str) -> float | None:
    folder = data_dir / "jobs" / job / "debug-output"
    times = [p.stat().st_mtime for p in folder.rglob("*") if p.is_file()] if folder.exists() else []
    return min(times) if times else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    # A SIGTERM (a timeout, a CI cancel) unwinds through the finally below: no cluster left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="tg-scale-"))
    load_before = os.getloadavg()
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        os.environ[key] = value
    s3, s3_url, s3_log = start_s3(work)
    cluster = api = None
    try:
        began = time.monotonic()
        cluster, ray_address = start_ray(args.jobs, args.rules)
        api, client, db_counts = start_api(work, secrets.token_urlsafe(24), ray_address, s3_url)
        print(f"cluster and API up in {time.monotonic() - began:.1f} s; work dir {work}", flush=True)
        result = measure(args, client, api.pid, work / "data", db_counts, s3_log)
    finally:
        if api is not None:
            api.send_signal(signal.SIGTERM)
            try:
                api.wait(20)
            except subprocess.TimeoutExpired:
                api.kill()
        if cluster is not None:
            cluster.shutdown()
        s3.terminate()
        s3.wait(10)
    result["load_average_before"] = [round(x, 2) for x in load_before]
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    result["cpu_cores"] = os.cpu_count()
    return result


def measure(args: argparse.Namespace, client: Client, api_pid: int, data_dir: Path, db_counts: Path,
            s3_log: Path) -> dict[str, Any]:  # fmt: skip
    names = [f"scale-{index:03d}" for index in range(args.jobs)]
    faulty = {name for index, name in enumerate(names) if index % 2 == 0}
    submitted: dict[str, float] = {}
    running: dict[str, float] = {}
    detected: dict[str, float] = {}
    stopped: dict[str, float] = {}
    final: dict[str, dict[str, Any]] = {}
    sampler = Sampler(api_pid, data_dir)
    db_before = json.loads(db_counts.read_text()) if db_counts.exists() else {"commits": 0, "writes": 0}
    s3_before = s3_requests(s3_log)

    refused: list[str] = []

    def submit(name: str) -> None:
        spec = job_spec(name, args.rules, name in faulty, args.steps, args.step_seconds, args.blowup_at)
        submitted[name] = time.time()
        status, body = client.call("POST", "/v1/jobs", spec)
        if status != 201:
            refused.append(f"creating {name}: {status} {body}")

    threads = [threading.Thread(target=submit, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if refused:
        raise SystemExit("\n".join(refused))
    deadline = time.monotonic() + args.timeout
    unfinished: list[str] = []
    while len(final) < len(names):
        if time.monotonic() > deadline:
            # Report what was measured so far, the unfinished jobs named, rather than nothing.
            unfinished = sorted(set(names) - set(final))
            print(f"timed out after {args.timeout:.0f} s: {len(unfinished)} jobs unfinished", flush=True)
            for name in unfinished:
                status, job = client.call("GET", f"/v1/jobs/{name}")
                final[name] = job if status == 200 else {"status": "Unknown", "rules": []}
            break
        sampler.sample()
        for name in names:
            if name in final:
                continue
            status, job = client.call("GET", f"/v1/jobs/{name}")
            if status != 200:
                continue
            now = time.time()
            roles = {c["role"]: c["state"] for c in job["components"]}
            if name not in running and job["status"] == "InProgress" and roles.get("training") == "Running":
                running[name] = now
            if name not in detected and any(r["status"] == "IssuesFound" for r in job["rules"]):
                detected[name] = now
            if name not in stopped and job["status"] == "Stopped":
                stopped[name] = now
            if job["status"] in TERMINAL and all(r["status"] != "InProgress" for r in job["rules"]):
                final[name] = job
        time.sleep(args.poll)
    ended = time.time()
    sampler.sample()
    db_after = json.loads(db_counts.read_text())
    s3_after = s3_requests(s3_log)
    return summarise(args, names, faulty, submitted, running, detected, stopped, final, sampler, data_dir,
                     {k: db_after[k] - db_before.get(k, 0) for k in ("commits", "writes")},
                     {k: v - s3_before.get(k, 0) for k, v in s3_after.items()}, ended) | {"unfinished_at_timeout": unfinished}  # fmt: skip


def summarise(args, names, faulty, submitted, running, detected, stopped, final, sampler, data_dir, db, s3,
              ended) -> dict[str, Any]:  # noqa: ANN001 - internal
    mib = 1024 * 1024
    to_running = [running[n] - submitted[n] for n in names if n in running]
    first_steps = [t - submitted[n] for n in names if (t := first_capture_time(data_dir, n)) is not None]
    detection = [stopped[n] - detected[n] for n in faulty if n in stopped and n in detected]
    api_detection = []
    for name in faulty:
        job = final[name]
        found = [r["last_modified_time"] for r in job["rules"] if r["status"] == "IssuesFound"]
        if job["status"] == "Stopped" and found and job.get("training_end_time"):
            api_detection.append(max(0.0, job["training_end_time"] - min(found)))
    saved_steps = sum(len(captured_steps(data_dir, n)) for n in names)
    evaluated = sum((r["last_evaluated_step"] or 0) + 1 for n in names for r in final[n]["rules"]
                    if r["last_evaluated_step"] is not None)  # fmt: skip
    job_minutes = sum(((final[n].get("training_end_time") or ended) - submitted[n]) / 60 for n in names)
    rule_minutes = job_minutes * args.rules
    runner_cpu = sum(sampler.runner_cpu.values())
    runner_peaks = sorted(sampler.runner_peak.values())
    s3_writes = s3.get("PUT", 0) + s3.get("POST", 0)
    s3_reads = s3.get("GET", 0) + s3.get("HEAD", 0)
    statuses: dict[str, int] = {}
    for job in final.values():
        statuses[job["status"]] = statuses.get(job["status"], 0) + 1
    faulty_stopped = sum(final[n]["status"] == "Stopped" for n in faulty)
    wall_minutes = (ended - min(submitted.values())) / 60
    return {
        "jobs": len(names), "rules_per_job": args.rules, "faulty_jobs": len(faulty), "faulty_stopped": faulty_stopped,
        "final_statuses": statuses,
        "failure_reasons": sorted({j["failure_reason"] for j in final.values() if j.get("failure_reason")})[:5], "steps_per_job": args.steps, "step_seconds": args.step_seconds,
        "wall_minutes": round(wall_minutes, 2),
        "submit_to_running_s": _quantiles(to_running), "submit_to_first_saved_step_s": _quantiles(first_steps),
        "detection_to_stopped_s": _quantiles(detection), "detection_to_stopped_api_timestamps_s": _quantiles(api_detection),
        "api_peak_rss_mib": round(sampler.api_peak / mib, 1),
        "rule_runner_processes": len(runner_peaks),
        "rules_per_runner_process": round(len(names) * args.rules / len(runner_peaks), 2) if runner_peaks else None,
        "rule_runner_peak_rss_mib": {"median": round(percentile(runner_peaks, 0.5) / mib, 1) if runner_peaks else None,
                                     "max": round(runner_peaks[-1] / mib, 1) if runner_peaks else None},
        "rule_runner_cpu_s_total": round(runner_cpu, 1), "rule_steps_evaluated": evaluated,
        "rule_runner_cpu_ms_per_evaluated_step": round(1000 * runner_cpu / evaluated, 2) if evaluated else None,
        "saved_steps": saved_steps, "s3_requests": s3,
        "s3_writes_per_saved_step": round(s3_writes / saved_steps, 2) if saved_steps else None,
        "s3_reads_per_saved_step": round(s3_reads / saved_steps, 2) if saved_steps else None,
        "s3_reads_per_saved_step_per_rule": round(s3_reads / (saved_steps * args.rules), 2) if saved_steps else None,
        "db": db, "job_minutes": round(job_minutes, 2),
        "db_commits_per_job_minute": round(db["commits"] / job_minutes, 1) if job_minutes else None,
        "db_commits_per_rule_minute": round(db["commits"] / rule_minutes, 1) if rule_minutes else None,
    }  # fmt: skip


def _quantiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    return {"n": len(values), "p50": round(percentile(values, 0.5), 2), "p95": round(percentile(values, 0.95), 2),
            "max": round(max(values), 2)}  # fmt: skip


def paper_estimate(result: dict[str, Any], jobs: int = 100, rules: int = 20, steps_per_second: float = 1.0,
                   ) -> list[tuple[str, str, str]]:  # fmt: skip
    """What ``jobs`` x ``rules`` need, scaled linearly from the measured per-unit costs, with each
    job saving ``steps_per_second`` steps (every rule evaluates every saved step)."""
    rows = []
    cpu_ms = result["rule_runner_cpu_ms_per_evaluated_step"] or 0.0
    evaluations = jobs * rules * steps_per_second
    rows.append(("rule-runner CPU", f"{cpu_ms:.1f} ms per evaluated step", f"{evaluations * cpu_ms / 1000:.1f} cores"))
    rss = result["rule_runner_peak_rss_mib"]["median"] or 0.0
    # One process per job when the rules are grouped (Ray), one per rule otherwise; a group's
    # memory grows little with its rules (the interpreter and numpy dominate): counted flat here.
    per_process = result.get("rules_per_runner_process") or 1.0
    processes = jobs if per_process > 1 else jobs * rules
    rows.append(("rule-runner memory", f"{rss:.0f} MiB per runner process (median peak, {per_process:g} rules each)",
                 f"{processes * rss / 1024:.1f} GiB ({processes} processes)"))  # fmt: skip
    writes = result["s3_writes_per_saved_step"] or 0.0
    rows.append(("S3 writes", f"{writes:.1f} per saved step", f"{jobs * steps_per_second * writes:.0f} req/s"))
    if per_process > 1:  # a group reads each step once for all its rules
        reads = result.get("s3_reads_per_saved_step") or 0.0
        rows.append(("S3 reads", f"{reads:.1f} per saved step (all the job's rules)",
                     f"{jobs * steps_per_second * reads:.0f} req/s"))  # fmt: skip
    else:
        reads = result["s3_reads_per_saved_step_per_rule"] or 0.0
        rows.append(("S3 reads", f"{reads:.1f} per saved step per rule", f"{evaluations * reads:.0f} req/s"))
    per_rule_minute = result["db_commits_per_rule_minute"] or 0.0
    rows.append(("API DB commits", f"{per_rule_minute:.1f} per rule-minute ({result['db_commits_per_job_minute']} "
                 f"per job-minute at {result['rules_per_job']} rules)", f"{jobs * rules * per_rule_minute / 60:.1f} /s"))
    rows.append(("API RSS", f"{result['api_peak_rss_mib']:.0f} MiB at {result['jobs']} jobs", "not scaled (measure)"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--rules", type=int, default=5)
    parser.add_argument("--steps", type=int, default=150, help="training steps per healthy job")
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--blowup-at", type=int, default=10, help="the faulty jobs' loss explodes from this step")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between status sweeps")
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--tiny", action="store_true", help="2 jobs x 2 rules, 30 short steps (the test's size)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.tiny:
        args.jobs, args.rules, args.steps, args.step_seconds, args.blowup_at = 2, 2, 30, 0.1, 3
    result = run(args)
    print(json.dumps(result, indent=1))
    print(f"\npaper estimate: 100 jobs x 20 rules, each job saving 1 step/s (linear in the measured costs)")
    print(f"{'resource':<20} {'measured per unit':<55} {'100 x 20 needs'}")
    for resource, unit, need in paper_estimate(result):
        print(f"{resource:<20} {unit:<55} {need}")
    if args.json:
        args.json.write_text(json.dumps({**result, "paper_estimate": paper_estimate(result)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
