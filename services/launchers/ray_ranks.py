"""Multi-instance training on Ray: the driver a job with ``InstanceCount > 1`` runs as its Ray job.

``python -m trainguard.services.launchers.ray_ranks --instances N --bundle JSON [--cwd DIR] -- CMD...``

The Ray launcher submits this driver as the job's one ``training`` submission (so the API sees one
training component, its exit code and its log, exactly as for one instance). The driver:

1. reserves a placement group of N bundles (each the job's per-instance resources plus one unit of
   the training resource) with ``STRICT_SPREAD``: every instance on its own node, as SageMaker gives
   each instance its own host. While fewer than N such nodes exist the group stays pending and the
   driver says so in its log every few seconds (the job stays in progress; see docs/ray.md);
2. starts one rank actor per bundle; rank 0's node IP and a free port there are the rendezvous;
3. runs CMD in each actor with ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``/
   ``LOCAL_RANK`` (one process per instance, so ``init_process_group("gloo")`` needs no torchrun)
   and SageMaker's host view: ``SM_HOSTS``/``SM_CURRENT_HOST`` (``algo-1..N``), and for a job under
   the container contract its contract with ``current_host`` set, so the runner writes each host's
   ``resourceconfig.json`` under its own ``SAGEMAKER_BASE_DIR``;
4. exits 0 when every rank did; when one rank fails (or its node dies) it stops the others and
   exits with that rank's code, after a line naming the rank, which the API reports as the reason;
5. on SIGTERM (Ray's stop_job) sends SIGTERM to every rank, SIGKILL after the grace, exits 143.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

__all__ = ["main", "rank_environment"]

_CONTRACT_ENV = "TRAINGUARD_SM_CONTRACT"  # sagemaker_container.contract.CONTRACT_ENV (checked in tests)
_KILLED_CODE = 137
_STOPPED_CODE = 128 + 15
_WAIT_LOG_SECONDS = 5.0


def rank_environment(
    base: dict[str, str], rank: int, world_size: int, master_addr: str, master_port: int
) -> dict[str, str]:
    """The variables one rank's process gets on top of the job's environment."""
    hosts = [f"algo-{index + 1}" for index in range(world_size)]
    environment = {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "NODE_RANK": str(rank),
        "SM_HOSTS": json.dumps(hosts),
        "SM_CURRENT_HOST": hosts[rank],
    }
    contract_json = base.get(_CONTRACT_ENV)
    if contract_json:
        # The contract runner derives SM_CURRENT_HOST and resourceconfig.json from the contract;
        # each host gets its own /opt/ml tree (one machine may hold several ranks).
        contract = json.loads(contract_json)
        contract["current_host"] = hosts[rank]
        contract["instance_count"] = world_size
        environment[_CONTRACT_ENV] = json.dumps(contract)
        if rank and base.get("SAGEMAKER_BASE_DIR"):
            environment["SAGEMAKER_BASE_DIR"] = f"{base['SAGEMAKER_BASE_DIR'].rstrip('/')}-{hosts[rank]}"
    return environment


class _Rank:
    """One instance: runs the command on its bundle's node (a threaded actor, so terminate() can
    interrupt run())."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._terminated = False

    def address(self) -> tuple[str, int]:
        import ray

        with socket.socket() as probe:  # a port free on this node now; the rendezvous binds it soon after
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def run(self, command: list[str], extra: dict[str, str], cwd: str | None, rank: int) -> int:
        environment = {**os.environ, **extra}
        with self._lock:
            if self._terminated:
                return _STOPPED_CODE
            self._process = subprocess.Popen(command, env=environment, cwd=cwd, start_new_session=True)
        import ray

        node = ray.get_runtime_context().get_node_id()
        print(f"trainguard ray: rank {rank} started on node {node} (pid {self._process.pid})", flush=True)
        code = self._process.wait()
        return code if code >= 0 else 128 - code

    def terminate(self, grace_seconds: float) -> None:
        with self._lock:
            self._terminated = True
            process = self._process
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def _wait_for_group(group: Any, instances: int, bundle: dict[str, float]) -> None:
    import ray

    started = time.monotonic()
    while True:
        ready, _ = ray.wait([group.ready()], timeout=_WAIT_LOG_SECONDS)
        if ready:
            return
        print(
            f"trainguard ray: waiting for {instances} nodes each offering {json.dumps(bundle)} "
            f"(one instance per node, STRICT_SPREAD): {time.monotonic() - started:.0f} s so far",
            flush=True,
        )


def _run(instances: int, bundle: dict[str, float], command: list[str], cwd: str | None, grace: float) -> int:
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init(address=os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=True)
    group = placement_group([dict(bundle)] * instances, strategy="STRICT_SPREAD")
    _wait_for_group(group, instances, bundle)
    custom = {key: value for key, value in bundle.items() if key not in ("CPU", "GPU", "memory")}
    rank_actor = ray.remote(_Rank)
    # Any: ray types an actor handle's methods as the class's own functions, while at run time
    # each is an actor method with .remote(); the calls below are the actor API's.
    ranks: list[Any] = [
        rank_actor.options(
            num_cpus=bundle.get("CPU", 0),
            num_gpus=bundle.get("GPU", 0),
            memory=bundle.get("memory"),
            resources=custom,
            max_concurrency=2,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index),
        ).remote()
        for index in range(instances)
    ]

    def stop_all(_signum: int = 0, _frame: Any = None) -> None:
        print("trainguard ray: stopping every rank", flush=True)
        try:
            ray.get([rank.terminate.remote(grace) for rank in ranks], timeout=grace + 10)
        except Exception as error:  # noqa: BLE001 - a dead rank has nothing left to stop
            print(f"trainguard ray: stop: {error}", flush=True)
        os._exit(_STOPPED_CODE)

    signal.signal(signal.SIGTERM, stop_all)
    master_addr, master_port = ray.get(ranks[0].address.remote())
    print(f"trainguard ray: {instances} instances, rendezvous {master_addr}:{master_port}", flush=True)
    base = dict(os.environ)
    runs = {}
    for index in range(instances):
        extra = rank_environment(base, index, instances, master_addr, master_port)
        runs[ranks[index].run.remote(command, extra, cwd, index)] = index
    pending = list(runs)
    while pending:
        # A short timeout: the SIGTERM handler runs between waits.
        done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
        if not done:
            continue
        rank = runs[done[0]]
        try:
            code = ray.get(done[0])
            reason = f"exit code {code}"
        except Exception as error:  # noqa: BLE001 - RayActorError: the rank's node or worker died
            code, reason = _KILLED_CODE, f"its Ray actor died ({str(error).strip().splitlines()[0][:200]})"
        if code != 0:
            print(f"trainguard ray: rank {rank} (algo-{rank + 1}) failed: {reason}; stopping the others", flush=True)
            for other in ranks:
                other.terminate.remote(grace)
            if pending:
                ray.wait(pending, num_returns=len(pending), timeout=grace + 10)
            print(f"RankFailed: rank {rank} (algo-{rank + 1}) of {instances} ended with {reason}", file=sys.stderr)
            return code
        print(f"trainguard ray: rank {rank} (algo-{rank + 1}) finished", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainguard.services.launchers.ray_ranks")
    parser.add_argument("--instances", type=int, required=True)
    parser.add_argument("--bundle", required=True, help="one instance's Ray resources, JSON")
    parser.add_argument("--cwd", default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    arguments = parser.parse_args(argv)
    command = arguments.command[1:] if arguments.command[:1] == ["--"] else arguments.command
    if arguments.instances < 1 or not command:
        parser.error("--instances >= 1 and a command are required")
    grace = max(1.0, float(os.environ.get("RAY_JOB_STOP_WAIT_TIME_S") or 30) - 2)
    # Every rank's lines verbatim in the job's log: Ray would fold similar lines of different
    # ranks into one ("repeated Nx across cluster") and colour the prefixes. Read when ray is imported.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    return _run(arguments.instances, json.loads(arguments.bundle), command, arguments.cwd, grace)


if __name__ == "__main__":
    sys.exit(main())
