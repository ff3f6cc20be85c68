"""Multi-instance training on a real multi-node Ray cluster (ray.cluster_utils.Cluster, one machine).

A head, TWO nodes offering ``training`` (one unit each, so STRICT_SPREAD must put each instance on
its own node) and a node offering ``rules``. Jobs go through the API (uvicorn subprocess,
TRAINGUARD_LAUNCHER=ray); training is a plain PyTorch DDP (gloo) script with one process per
instance and no torchrun, captured zero-code by ``trainguard run``. Nothing is mocked.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.s3_server import free_port
from tests.services.conftest import CUSTOM_RULE, HOOK_EVERY_STEP, REPO, wait_for

pytest.importorskip("ray.job_submission", reason="the ray launcher tests need Ray: pip install -e '.[ray]'")

from trainguard.services.launchers.base import ComponentSpec, ComponentState, JobLaunch  # noqa: E402
from trainguard.services.launchers.ray import RayLauncher  # noqa: E402

pytestmark = pytest.mark.slow
DDP_SCRIPT = str(REPO / "tests" / "services" / "ddp_train_script.py")
ENDED = ("Completed", "Failed", "Stopped")


@dataclass(frozen=True)
class TwoTrainingNodes:
    address: str
    training_nodes: frozenset[str]
    rules_node: str
    cluster: Any


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[TwoTrainingNodes]:
    from ray.cluster_utils import Cluster

    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), saved or ""]).rstrip(os.pathsep)
    port = free_port()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": True, "dashboard_host": "127.0.0.1",
                        "dashboard_port": port},
    )  # fmt: skip
    try:
        training = [cluster.add_node(num_cpus=1, resources={"training": 1}) for _ in range(2)]
        rules = cluster.add_node(num_cpus=1, resources={"rules": 4})
        cluster.wait_for_nodes()
        address = f"http://127.0.0.1:{port}"

        def job_api_answers() -> bool:
            try:
                RayLauncher(address).jobs()
                return True
            except Exception:  # noqa: BLE001 - not up yet
                return False

        wait_for(job_api_answers, 90, "the Ray job API", interval=1.0)
        yield TwoTrainingNodes(address, frozenset(node.node_id for node in training), rules.node_id, cluster)
    finally:
        cluster.shutdown()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@pytest.fixture(autouse=True)
def _cluster_released_after_each_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every Ray job a test started is stopped after it: a job the API left running (the API is
    killed, not the jobs, by design) would keep its placement group, and the next test's
    2-instance job would wait for nodes forever (seen in CI: one timeout under load cascaded into
    every later test of this module)."""
    yield
    if "ray_cluster" not in request.fixturenames:
        return
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(request.getfixturevalue("ray_cluster").address)
    terminal = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
    for job in client.list_jobs():
        if job.status not in terminal and job.submission_id:
            try:
                client.stop_job(job.submission_id)
            except Exception:  # noqa: BLE001 - it may have ended meanwhile
                pass
    wait_for(lambda: all(job.status in terminal for job in client.list_jobs()), 90, "the tests' Ray jobs to stop")


def _rank_nodes(log: str) -> dict[int, str]:
    return {int(rank): node for rank, node in re.findall(r"rank (\d) started on node ([0-9a-f]+)", log)}


def _rule(threshold: float, actions: list | None = None) -> dict:
    return {"rule": CUSTOM_RULE, "name": "LossWatch", "parameters": {"threshold": threshold}, "actions": actions or []}


def test_two_instance_ddp_job_captures_both_ranks_and_the_rule_checks_them(ray_cluster, api_factory) -> None:
    api = api_factory(TRAINGUARD_LAUNCHER="ray", RAY_ADDRESS=ray_cluster.address, TRAINGUARD_STOP_GRACE_SECONDS="5")
    spec = {
        "name": "ddp-two",
        "command": [sys.executable, DDP_SCRIPT, "--steps", "12"],
        "resources": {"instance_count": 2, "cpus": 1},
        "hook_config": HOOK_EVERY_STEP,
        "rules": [_rule(1000.0)],
    }
    began = time.monotonic()
    status, body = api.request("POST", "/v1/jobs", spec)
    assert status == 201, body
    job = wait_for(
        lambda: (j := api.job("ddp-two"))["status"] in ("Completed", "Failed", "Stopped")
        and j["rules"][0]["status"] != "InProgress" and j,
        180,
        "the 2-instance job to end",
    )
    log = api.request("GET", "/v1/jobs/ddp-two/logs?component=training")[1]
    assert job["status"] == "Completed", (job, log[-3000:])
    nodes = _rank_nodes(log)
    assert set(nodes) == {0, 1} and set(nodes.values()) == set(ray_cluster.training_nodes), log[-3000:]
    assert 'SM_CURRENT_HOST=algo-2 SM_HOSTS=["algo-1", "algo-2"]' in log
    capture = api.data_dir / "jobs" / "ddp-two" / "debug-output" / "index"
    workers = {re.sub(r"^\d+_", "", path.stem) for path in capture.rglob("*.json")}
    assert workers == {"worker_0", "worker_1"}, workers
    rule = job["rules"][0]
    assert rule["status"] == "NoIssuesFound" and rule["last_evaluated_step"] == 11, rule
    print(f"2-instance DDP job on Ray: submit to Completed {time.monotonic() - began:.1f} s")



def _submit_long_job(ray_cluster, api_factory, name: str, fault: list[str], hook_config: dict, rules: list):  # noqa: ANN001
    """A 2-instance job of 400 slow steps (time for a rule to stop it), submitted to a Ray-launcher API."""
    api = api_factory(TRAINGUARD_LAUNCHER="ray", RAY_ADDRESS=ray_cluster.address, TRAINGUARD_STOP_GRACE_SECONDS="5")
    spec = {
        "name": name,
        "command": [sys.executable, DDP_SCRIPT, "--steps", "400", *fault, "--step-seconds", "0.05"],
        "resources": {"instance_count": 2},
        "hook_config": hook_config,
        "rules": rules,
    }
    status, body = api.request("POST", "/v1/jobs", spec)
    assert status == 201, body
    return api

def test_a_fault_on_rank_1_is_attributed_to_worker_1_and_the_job_stopped(ray_cluster, api_factory) -> None:
    api = _submit_long_job(ray_cluster, api_factory, "ddp-fault", ["--fault-rank", "1", "--fault-from", "4"],
                           HOOK_EVERY_STEP, [_rule(1000.0, [{"name": "stoptraining"}])])
    job = wait_for(lambda: (j := api.job("ddp-fault"))["status"] == "Stopped" and j, 180, "the rule to stop the job")
    rule = job["rules"][0]
    assert rule["status"] == "IssuesFound", rule
    assert "worker_1" in str(rule) and "worker_0" not in str(rule), rule
    log = api.request("GET", "/v1/jobs/ddp-fault/logs?component=training")[1]
    assert "stopping every rank" in log and "rank 1 step 399" not in log
    launcher = RayLauncher(ray_cluster.address)
    assert launcher.status("ddp-fault")["training"].state is ComponentState.EXITED


def test_replicas_drifting_apart_on_two_instances_are_found_and_the_job_stopped(ray_cluster, api_factory) -> None:
    """ReplicaDivergence on the Ray launcher's multi-instance job: rank 1's replica is nudged
    after step 5; the rule compares both instances' fingerprints, names the step and stops the
    job once a second fingerprint confirms it."""
    api = _submit_long_job(ray_cluster, api_factory, "ddp-drift", ["--nudge-rank", "1", "--nudge-at", "5"],
                           {"HookParameters": {"save_interval": "2"}},
                           [{"rule": "ReplicaDivergence", "name": "Replicas", "actions": [{"name": "stoptraining"}]}])
    job = wait_for(lambda: (j := api.job("ddp-drift"))["status"] in ENDED and j, 180, "the rule to stop the job")
    log = api.request("GET", "/v1/jobs/ddp-drift/logs?component=training")[1]
    assert job["status"] == "Stopped", (job, log[-3000:])
    rule = job["rules"][0]
    assert rule["status"] == "IssuesFound", rule
    # the nudge after step 5's update shows in the fingerprint of step 6 (saved every 2 steps)
    assert "first at step 6" in str(rule) and "ranks 0, 1" in str(rule), rule
    assert "rank 1 step 399" not in log

def test_one_rank_dying_fails_the_job_with_the_rank_named(ray_cluster, api_factory) -> None:
    api = api_factory(TRAINGUARD_LAUNCHER="ray", RAY_ADDRESS=ray_cluster.address, TRAINGUARD_STOP_GRACE_SECONDS="5")
    command = [sys.executable, DDP_SCRIPT, "--steps", "400", "--step-seconds", "0.05"]
    spec = {"name": "ddp-rank-dies", "command": command, "resources": {"instance_count": 2}}
    assert api.request("POST", "/v1/jobs", spec)[0] == 201
    logs = lambda: api.request("GET", "/v1/jobs/ddp-rank-dies/logs?component=training")[1]  # noqa: E731
    try:
        wait_for(lambda: "rank 1 step 3 " in logs(), 120, "rank 1 to train")
    except AssertionError:
        print(api.job("ddp-rank-dies"), logs()[-3000:])
        raise
    pid = int(re.search(r"rank 1 started on node [0-9a-f]+ \(pid (\d+)\)", logs()).group(1))
    os.kill(pid, signal.SIGKILL)  # rank 1's training process (trainguard run) dies; rank 0 is healthy
    job = wait_for(lambda: (j := api.job("ddp-rank-dies"))["status"] == "Failed" and j, 90, "the job to fail")
    assert "rank 1 (algo-2) of 2 ended with exit code 137" in job["failure_reason"], job["failure_reason"]
    assert "rank 0 step 399" not in logs()  # rank 0 was stopped, not left to finish or hang


def test_rank_environment_gives_each_host_its_own_view() -> None:
    from trainguard.services.launchers.ray_ranks import _CONTRACT_ENV, rank_environment
    from trainguard.services.sagemaker_container.contract import CONTRACT_ENV, JobContract

    assert _CONTRACT_ENV == CONTRACT_ENV
    base = {CONTRACT_ENV: JobContract("j", instance_count=2).to_json(), "SAGEMAKER_BASE_DIR": "/d/ml"}
    second = rank_environment(base, 1, 2, "10.0.0.5", 29500)
    rendezvous = (second["RANK"], second["WORLD_SIZE"], second["MASTER_ADDR"], second["MASTER_PORT"])
    assert rendezvous == ("1", "2", "10.0.0.5", "29500")
    assert second["SM_CURRENT_HOST"] == "algo-2" and second["SAGEMAKER_BASE_DIR"] == "/d/ml-algo-2"
    contract = JobContract.from_json(second[CONTRACT_ENV])
    assert contract.current_host == "algo-2" and contract.hosts == ["algo-1", "algo-2"]
    first = rank_environment(base, 0, 2, "10.0.0.5", 29500)
    assert JobContract.from_json(first[CONTRACT_ENV]).current_host == "algo-1" and "SAGEMAKER_BASE_DIR" not in first


def test_a_restarted_api_finds_the_two_instance_job_again(ray_cluster, api_factory) -> None:
    api = api_factory(TRAINGUARD_LAUNCHER="ray", RAY_ADDRESS=ray_cluster.address, TRAINGUARD_STOP_GRACE_SECONDS="5")
    steps = 150
    spec = {
        "name": "ddp-survivor",
        "command": [sys.executable, DDP_SCRIPT, "--steps", str(steps), "--step-seconds", "0.05"],
        "resources": {"instance_count": 2},
        "hook_config": HOOK_EVERY_STEP,
        "rules": [_rule(1000.0)],
    }
    assert api.request("POST", "/v1/jobs", spec)[0] == 201
    wait_for(lambda: api.job("ddp-survivor")["rules"][0]["last_evaluated_step"] is not None, 120, "a rule report")
    api.kill(signal.SIGKILL)  # the API dies mid-job; the driver and both ranks go on in Ray
    api.start()
    assert "ddp-survivor" in [j["name"] for j in api.request("GET", "/v1/jobs")[1]["jobs"]]
    job = wait_for(
        lambda: (j := api.job("ddp-survivor"))["status"] in ENDED and j["rules"][0]["status"] != "InProgress" and j,
        180,
        "the job to end under the new API",
    )
    assert job["status"] == "Completed" and job["rules"][0]["status"] == "NoIssuesFound", job
    assert job["rules"][0]["last_evaluated_step"] == steps - 1
    capture = api.data_dir / "jobs" / "ddp-survivor" / "debug-output" / "index"
    last = {path.stem for path in capture.rglob(f"{steps - 1:012d}_*.json")}
    assert last == {f"{steps - 1:012d}_worker_0", f"{steps - 1:012d}_worker_1"}, last


def test_instance_count_is_validated_and_gpus_are_requested(ray_cluster, api_factory) -> None:
    api = api_factory(TRAINGUARD_LAUNCHER="ray", RAY_ADDRESS=ray_cluster.address)
    for bad in (0, 65, "2"):
        status, body = api.request("POST", "/v1/jobs", {"name": "bad-count", "command": ["true"],
                                                        "resources": {"instance_count": bad}})  # fmt: skip
        assert status in (400, 422) and "instance_count" in str(body), (bad, status, body)
    # A GPU asked of a GPU-less cluster: the job waits in progress and its log says for what.
    launcher = RayLauncher(ray_cluster.address, stop_grace_seconds=3)
    launcher.start(JobLaunch("needs-gpu", (ComponentSpec("training", "", ("true",), gpus=1),)))
    wait_for(lambda: "waiting for 1 nodes each offering" in launcher.logs("needs-gpu"), 60, "the waiting reason")
    assert '"GPU": 1' in launcher.logs("needs-gpu")
    assert launcher.status("needs-gpu")["training"].state is ComponentState.RUNNING
    launcher.stop("needs-gpu", grace_seconds=0)
    wait_for(lambda: launcher.status("needs-gpu")["training"].state is ComponentState.EXITED, 30, "the stop")
    launcher.remove("needs-gpu")


def test_sagemaker_two_instance_job_on_ray_rules_read_s3(ray_cluster, api_factory, s3_endpoint) -> None:
    """CreateTrainingJob with InstanceCount 2: both hosts run under the container contract with their
    own SM_CURRENT_HOST, the capture reaches S3 and the rule runner reads it from S3 (not the shared
    directory), finding rank 1's fault in worker_1."""
    from tests.s3_server import s3_client
    from tests.services.test_sagemaker_endpoint import _request

    bucket = s3_client(s3_endpoint)
    try:
        bucket.create_bucket(Bucket="bkt")
    except bucket.exceptions.BucketAlreadyOwnedByYou:
        pass
    api = api_factory(TRAINGUARD_LAUNCHER="ray", RAY_ADDRESS=ray_cluster.address, S3_ENDPOINT_URL=s3_endpoint,
                      TRAINGUARD_STOP_GRACE_SECONDS="5")  # fmt: skip
    client = api.sagemaker()
    name = "sm-ddp-on-ray"
    rules = [{"RuleConfigurationName": "LossWatch", "RuleEvaluatorImage": "rules:latest",
              "RuleParameters": {"rule_to_invoke": CUSTOM_RULE, "threshold": "1000.0"}}]  # fmt: skip
    command = [sys.executable, DDP_SCRIPT, "--steps", "10", "--fault-rank", "1", "--fault-from", "6"]
    request = _request(name, command, rules)
    request["ResourceConfig"]["InstanceCount"] = 2
    client.create_training_job(**request)
    description = wait_for(
        lambda: (d := client.describe_training_job(TrainingJobName=name))["TrainingJobStatus"] in ENDED
        and d["DebugRuleEvaluationStatuses"][0]["RuleEvaluationStatus"] != "InProgress"
        and d,
        180,
        "the 2-instance SageMaker job and its rule to end",
    )
    launcher = RayLauncher(ray_cluster.address)
    log = launcher.logs(name)
    assert description["TrainingJobStatus"] == "Completed", (description, log[-3000:])
    status = description["DebugRuleEvaluationStatuses"][0]
    assert status["RuleEvaluationStatus"] == "IssuesFound", _what_the_rule_saw(launcher, bucket, name, status)
    native = api.job(name)["rules"][0]  # the SageMaker view's details do not name workers; the native one does
    assert "worker_1" in str(native) and "worker_0" not in str(native), native
    assert set(_rank_nodes(log).values()) == set(ray_cluster.training_nodes), log[-3000:]
    assert 'SM_CURRENT_HOST=algo-2 SM_HOSTS=["algo-1", "algo-2"]' in log
    rule_job = launcher._latest_by_role(name)["rule:LossWatch"]
    assert rule_job.runtime_env["env_vars"]["BASE_TRIAL"] == f"s3://bkt/{name}/debug-output"
    keys = [o["Key"] for o in bucket.list_objects_v2(Bucket="bkt", Prefix=f"{name}/debug-output/index/")["Contents"]]
    assert any(k.endswith("_worker_0.json") for k in keys) and any(k.endswith("_worker_1.json") for k in keys)


def test_ray_plan_carries_instances_gpus_and_the_s3_rule_input(tmp_path) -> None:
    """Planning only (no GPU here): what the Ray launcher is given and what it submits for it."""
    from trainguard.services.api.planner import plan_job
    from trainguard.services.api.schemas import JobSpec
    from trainguard.services.api.settings import Settings
    from trainguard.services.sagemaker_container.contract import CONTRACT_ENV, contract_from_request
    from tests.services.test_sagemaker_endpoint import _request

    settings = Settings.from_env({"TRAINGUARD_API_TOKEN": "planner-token", "TRAINGUARD_DATA_DIR": str(tmp_path)})
    request = _request("sm-gpu", ["python", "train.py"], [])
    request["ResourceConfig"].update(InstanceType="ml.p3.8xlarge", InstanceCount=2)
    contract = contract_from_request(request)
    spec = JobSpec.model_validate({
        "name": "sm-gpu", "command": ["python", "train.py"], "environment": {CONTRACT_ENV: contract.to_json()},
        "hook_config": {"S3OutputPath": "s3://bkt/"},
        "rules": [{"rule": CUSTOM_RULE, "name": "LossWatch"}],
    })  # fmt: skip
    components = {c.role: c for c in plan_job(spec, settings, "ray", "t").components}
    training = components["training"]
    assert (training.instance_count, training.gpus) == (2, 4)  # ml.p3.8xlarge: 4 GPUs per instance
    assert components["rule:LossWatch"].environment["BASE_TRIAL"] == "s3://bkt/sm-gpu/debug-output"
    entrypoint = RayLauncher("http://unused:8265")._entrypoint(training)
    assert '"GPU": 4' in entrypoint and "--instances 2" in entrypoint and "STRICT" not in entrypoint
    native = JobSpec.model_validate({"name": "n", "command": ["true"], "resources": {"gpus": 1}})
    single = plan_job(native, settings, "ray", "t").components[0]
    assert RayLauncher("http://unused:8265")._resources(single) == {"entrypoint_num_cpus": 0}  # the driver's
    local = plan_job(native, settings, "local", "t")
    assert local.components[0].gpus is None and local.components[0].instance_count == 1
    with pytest.raises(ValueError, match="resources.instance_count"):
        plan_job(JobSpec.model_validate({"name": "m", "command": ["true"], "resources": {"instance_count": 2}}),
                 settings, "local", "t")  # fmt: skip


def _what_the_rule_saw(launcher: RayLauncher, bucket: Any, name: str, status: Any) -> str:
    """A failed verdict's evidence: each worker's steps on S3 (with the end marker's time) and the
    trainguard lines of the training and rule logs."""
    listing = bucket.list_objects_v2(Bucket="bkt", Prefix=f"{name}/debug-output/")
    objects = sorted(listing.get("Contents", []), key=lambda o: o["LastModified"])
    times = [f"{o['LastModified']:%H:%M:%S.%f} {o['Key'].split('/debug-output/')[-1]}" for o in objects]
    lines = [line for line in launcher.logs(name).splitlines() if "trainguard" in line.lower()]
    rules = launcher.logs(name, "rule:LossWatch", tail=60)
    uploader = launcher.logs(name, "uploader", tail=30)
    return "\n".join([str(status), "S3 objects in upload order:", *times, "training log (trainguard lines):",
                      *lines[-40:], "rule log:", rules, "uploader log:", uploader])  # fmt: skip
