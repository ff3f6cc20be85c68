"""Load on the control API: N concurrent clients create, describe and list jobs.

Starts the API (``python -m trainguard.services.api``, local launcher, a fresh data dir) unless
``--url`` points at a running one, then runs ``--clients`` threads; each creates
``--jobs-per-client`` jobs (a short harmless training command), describing each job after creating
it and listing all jobs every few creations. Prints p50/p95/max latency and errors per operation,
then waits for every job to end and counts final states (all must be Completed).

    python bench/load_api.py --clients 10 --jobs-per-client 10
    python bench/load_api.py --url http://127.0.0.1:8080 --token "$TRAINGUARD_API_TOKEN"
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TERMINAL = ("Completed", "Failed", "Stopped")


class Client:
    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path, data=data, method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with self.opener.open(request, timeout=60) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")[:300]
        except OSError as error:
            return 0, str(error)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_api(data_dir: Path, token: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "TRAINGUARD_API_TOKEN": token,
        "TRAINGUARD_DATA_DIR": str(data_dir),
        "TRAINGUARD_LAUNCHER": "local",
        "TRAINGUARD_PORT": str(port),
        "NO_PROXY": "127.0.0.1,localhost",
    }
    log = open(data_dir / "api.log", "ab")  # noqa: SIM115 - the child keeps it
    process = subprocess.Popen(
        [sys.executable, "-m", "trainguard.services.api", "--log-level", "warning"],
        cwd=REPO, env=environment, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    probe = Client(url, token)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the API exited with {process.returncode}; see {data_dir / 'api.log'}")
        if probe.call("GET", "/health")[0] == 200:
            return process, url
        time.sleep(0.2)
    process.kill()
    raise SystemExit("the API did not answer /health within 60 s")


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a local process (Linux), to tell a busy API from a starved one."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def run_clients(client: Client, clients: int, jobs_per_client: int, prefix: str, command: list[str]) -> tuple[
        dict[str, list[float]], dict[str, Counter], list[str]]:  # fmt: skip
    latencies: dict[str, list[float]] = defaultdict(list)
    errors: dict[str, Counter] = defaultdict(Counter)
    created: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def timed(operation: str, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200,)) -> bool:
        started = time.perf_counter()
        status, answer = client.call(method, path, body)
        elapsed = time.perf_counter() - started
        with lock:
            latencies[operation].append(elapsed)
            if status not in ok:
                errors[operation][f"{status}: {str(answer)[:80]}"] += 1
        return status in ok

    def worker(index: int) -> None:
        barrier.wait()  # every client starts at once
        for number in range(jobs_per_client):
            name = f"{prefix}-{index}-{number}"
            if timed("create", "POST", "/v1/jobs", {"name": name, "command": command}, ok=(201,)):
                with lock:
                    created.append(name)
                timed("describe", "GET", f"/v1/jobs/{name}")
            if number % 3 == 0:
                timed("list", "GET", "/v1/jobs")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, errors, created


def wait_for_ends(client: Client, names: list[str], timeout: float) -> Counter:
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        status, answer = client.call("GET", "/v1/jobs")
        if status == 200:
            states = {job["name"]: job["status"] for job in answer["jobs"] if job["name"] in names}
            if len(states) == len(names) and all(s in TERMINAL for s in states.values()):
                break
        time.sleep(1.0)
    return Counter(states.get(name, "missing") for name in names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--jobs-per-client", type=int, default=10)
    parser.add_argument("--url", help="a running API (default: start one with the local launcher)")
    parser.add_argument("--token", default=os.environ.get("TRAINGUARD_API_TOKEN", ""))
    parser.add_argument("--end-timeout", type=float, default=600.0, help="seconds to wait for every job to end")
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    args = parser.parse_args(argv)

    process = None
    temporary = None
    if args.url:
        if not args.token:
            parser.error("--url needs --token or TRAINGUARD_API_TOKEN")
        url, token = args.url, args.token
    else:
        temporary = tempfile.TemporaryDirectory(prefix="tg-load-")
        token = secrets.token_urlsafe(24)
        process, url = start_api(Path(temporary.name), token)
    client = Client(url, token)
    prefix = f"load-{secrets.token_hex(3)}"
    command = [sys.executable, "-c", "import time; time.sleep(0.5)"]
    try:
        pid = process.pid if process is not None else None
        cpu_before, load_before = cpu_seconds(pid), os.getloadavg()[0]
        started = time.perf_counter()
        latencies, errors, created = run_clients(client, args.clients, args.jobs_per_client, prefix, command)
        submit_seconds = time.perf_counter() - started
        cpu_after, load_after = cpu_seconds(pid), os.getloadavg()[0]
        ends = wait_for_ends(client, created, args.end_timeout)
    finally:
        if process is not None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        if temporary is not None:
            temporary.cleanup()

    summary = {
        "clients": args.clients,
        "jobs": args.clients * args.jobs_per_client,
        "created": len(created),
        "submit_wall_seconds": round(submit_seconds, 2),
        "operations": {
            operation: {
                "count": len(values),
                "p50_ms": round(1000 * statistics.median(values), 1),
                "p95_ms": round(1000 * percentile(values, 0.95), 1),
                "max_ms": round(1000 * max(values), 1),
                "errors": sum(errors[operation].values()),
            }
            for operation, values in sorted(latencies.items())
        },
        "error_kinds": {op: dict(kinds) for op, kinds in errors.items() if kinds},
        "final_states": dict(ends),
        "cpus": os.cpu_count(),
        "api_cpu_seconds_during_submit": (
            round(cpu_after - cpu_before, 2) if cpu_before is not None and cpu_after is not None else None
        ),
        "load_average_before_after": [round(load_before, 1), round(load_after, 1)],
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['jobs']} jobs from {args.clients} concurrent clients, submitted in {submit_seconds:.2f} s "
              f"({os.cpu_count()} CPUs)")  # fmt: skip
        print("| operation | count | p50 ms | p95 ms | max ms | errors |")
        print("|---|---|---|---|---|---|")
        for operation, row in summary["operations"].items():
            cells = [operation, *(row[key] for key in ("count", "p50_ms", "p95_ms", "max_ms", "errors"))]
            print("| " + " | ".join(str(cell) for cell in cells) + " |")
        print("final states:", dict(ends))
        print(f"API CPU seconds during the submit phase: {summary['api_cpu_seconds_during_submit']}; "
              f"1-min load average before/after: {summary['load_average_before_after']}")
        for operation, kinds in summary["error_kinds"].items():
            print(f"errors in {operation}: {kinds}")
    healthy = not any(errors.values()) and set(ends) <= {"Completed"} and len(created) == summary["jobs"]
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
