"""The Ray launcher on a real multi-node Ray cluster on this machine.

``ray.cluster_utils.Cluster`` starts real Ray nodes (a head, a node offering the ``training``
resource, a node offering the ``rules`` resource: separate raylets, as separate machines would
run), and the launcher submits real Ray jobs to the head's job API. Nothing is mocked: the
components are real processes, the end-to-end test runs the API (uvicorn subprocess) with
TRAINGUARD_LAUNCHER=ray, real PyTorch training under ``trainguard run`` and a real rule runner.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.s3_server import free_port
from tests.services.conftest import CUSTOM_RULE, HOOK_EVERY_STEP, REPO, training_command, wait_for

pytest.importorskip("ray.job_submission", reason="the ray launcher tests need Ray: pip install -e '.[ray]'")

from trainguard.services.launchers.base import ComponentSpec, ComponentState, JobLaunch  # noqa: E402
from trainguard.services.launchers.ray import RayLauncher  # noqa: E402

pytestmark = pytest.mark.slow

GRACE = 3.0  # the stop grace the launchers here submit with (RAY_JOB_STOP_WAIT_TIME_S)


@dataclass(frozen=True)
class RayCluster:
    address: str  # the head's job API (dashboard) URL
    head_node: str
    training_node: str
    rules_node: str
    cluster: Any  # the ray.cluster_utils.Cluster: tests add and kill nodes


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    from ray.cluster_utils import Cluster

    # The nodes' processes inherit this environment: the rule runners import the tests' custom rules.
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), saved or ""]).rstrip(os.pathsep)
    port = free_port()
    # One logical CPU per node: this machine's cores are shared; placement is by custom resources.
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": True,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": port,
        },
    )
    try:
        training = cluster.add_node(num_cpus=1, resources={"training": 2})
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
        yield RayCluster(address, cluster.head_node.node_id, training.node_id, rules.node_id, cluster)
    finally:
        cluster.shutdown()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def _python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def _states(launcher: RayLauncher, job: str) -> dict[str, ComponentState]:
    return {role: status.state for role, status in launcher.status(job).items()}


def _cleanup(launcher: RayLauncher, job: str) -> None:
    launcher.stop(job, grace_seconds=0)
    wait_for(lambda: all(s is ComponentState.EXITED for s in _states(launcher, job).values()), 30, f"{job} to end")
    launcher.remove(job)


def _add_ready_node(ray_cluster: RayCluster, resource: str) -> Any:
    """A new node offering ``resource``, once it has run a job: a just-added node's agents may take
    a while to come up on a loaded machine, and the test must not time that instead of the launcher."""
    tag = f"probe_{resource}"
    node = ray_cluster.cluster.add_node(num_cpus=1, resources={resource: 4, tag: 1})
    ray_cluster.cluster.wait_for_nodes()
    probe = RayLauncher(ray_cluster.address, rules_resource=tag)
    probe.start(JobLaunch(f"probe-{resource}", (ComponentSpec("rule:probe", "", _python("print('probed')")),)))
    wait_for(lambda: probe.status(f"probe-{resource}")["rule:probe"].exit_code == 0, 120, f"the new {resource} node")
    assert probe.node_of(f"probe-{resource}", "rule:probe") == node.node_id
    probe.remove(f"probe-{resource}")
    return node


def test_components_run_on_their_nodes_and_a_new_launcher_finds_them(ray_cluster: RayCluster, tmp_path) -> None:
    launcher = RayLauncher(ray_cluster.address, stop_grace_seconds=GRACE)
    job = JobLaunch(
        "placed",
        (
            ComponentSpec("training", "", _python(
                "import os, time; print('lr', os.environ['LR'], flush=True); time.sleep(60)"
            ), {"LR": "0.5"}, cpus=1, memory_mb=64),
            ComponentSpec("rule:Loss", "", _python("import os; print('cwd', os.getcwd()); raise SystemExit(1)"),
                          working_dir=str(tmp_path / "rule-cwd")),
            ComponentSpec("uploader", "", _python("print('uploaded')")),
        ),
    )  # fmt: skip
    launcher.start(job)
    launcher.start(job)  # idempotent: nothing submitted twice
    wait_for(
        lambda: launcher.status("placed")["rule:Loss"].state is ComponentState.EXITED, 90, "the rule runner to end"
    )
    wait_for(lambda: "lr 0.5" in launcher.logs("placed", "training"), 60, "training's output")

    # (Ray fills a job's driver node in its job info a moment after the job's state: under load a
    # rule job that has just exited may not have it yet)
    assert wait_for(lambda: launcher.node_of("placed", "training"), 30, "training's node") == ray_cluster.training_node
    assert wait_for(lambda: launcher.node_of("placed", "rule:Loss"), 30, "the rule's node") == ray_cluster.rules_node
    status = launcher.status("placed")
    assert status["training"].state is ComponentState.RUNNING
    assert (status["rule:Loss"].exit_code, status["rule:Loss"].reason) == (1, "")  # a verdict code passes through
    assert f"cwd {tmp_path / 'rule-cwd'}" in launcher.logs("placed", "rule:Loss")

    # A new launcher instance (a restarted API) knows everything from Ray alone.
    restarted = RayLauncher(ray_cluster.address, stop_grace_seconds=GRACE)
    assert "placed" in restarted.jobs()
    assert _states(restarted, "placed")["training"] is ComponentState.RUNNING
    assert restarted.node_of("placed", "training") == ray_cluster.training_node

    # restart() resubmits an exited component as it was first started; the log goes on.
    restarted.restart("placed", "rule:Loss")
    printed = f"cwd {tmp_path / 'rule-cwd'}"  # the command's own line (Ray's log also echoes the entrypoint)
    wait_for(lambda: restarted.logs("placed", "rule:Loss").count(printed) == 2, 90, "the restarted rule runner")
    assert "restarting rule:Loss (restart 1)" in restarted.logs("placed", "rule:Loss")
    assert wait_for(lambda: restarted.node_of("placed", "rule:Loss"), 30, "the rule's node") == ray_cluster.rules_node
    assert (
        restarted.logs("placed", "rule:Loss", tail=1).strip() == restarted.logs("placed", "rule:Loss").splitlines()[-1]
    )

    _cleanup(restarted, "placed")
    assert "placed" not in launcher.jobs() and launcher.status("placed") == {}


def test_stop_terminates_and_kills_after_the_grace(ray_cluster: RayCluster) -> None:
    launcher = RayLauncher(ray_cluster.address, stop_grace_seconds=GRACE)
    # "ready 42" is printed, never echoed: Ray's log also shows the entrypoint's source.
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, lambda *_: print('ignoring TERM', flush=True))\n" \
               "print('ready', 40 + 2, flush=True)\nwhile True: time.sleep(0.1)"  # fmt: skip
    polite = "import time; print('ready', 40 + 2, flush=True); time.sleep(600)"
    launcher.start(JobLaunch("stopped", (ComponentSpec("training", "", _python(polite)),
                                         ComponentSpec("rule:Stubborn", "", _python(stubborn)))))  # fmt: skip
    wait_for(lambda: all("ready 42" in launcher.logs("stopped", role) for role in ("training", "rule:Stubborn")),
             90, "both components to run")  # fmt: skip

    began = time.monotonic()
    launcher.stop("stopped", ("training",))
    wait_for(lambda: _states(launcher, "stopped")["training"] is ComponentState.EXITED, 30, "training to stop")
    polite_took = time.monotonic() - began
    assert _states(launcher, "stopped")["rule:Stubborn"] is ComponentState.RUNNING  # only the roles asked
    assert launcher.status("stopped")["training"].exit_code == 128 + signal.SIGTERM

    began = time.monotonic()
    launcher.stop("stopped")
    wait_for(lambda: _states(launcher, "stopped")["rule:Stubborn"] is ComponentState.EXITED, 30, "the stubborn one")
    stubborn_took = time.monotonic() - began
    assert "ignoring TERM" in launcher.logs("stopped", "rule:Stubborn")
    assert polite_took < GRACE, f"SIGTERM should end a polite process at once, took {polite_took:.1f} s"
    assert GRACE - 0.5 <= stubborn_took < GRACE + 10, (
        f"SIGKILL should come after the {GRACE} s grace: {stubborn_took:.1f} s"
    )
    launcher.remove("stopped")


def test_api_with_the_ray_launcher_finds_a_faulty_job_and_stops_it(ray_cluster: RayCluster, api_factory) -> None:
    api = api_factory(TRAINGUARD_LAUNCHER="ray", RAY_ADDRESS=ray_cluster.address, TRAINGUARD_STOP_GRACE_SECONDS="5")
    assert api.request("GET", "/health", auth=False)[1]["launcher"] == "ray"
    spec = {
        "name": "ray-blowup",
        "command": training_command("--steps", "600", "--blowup-at", "4", "--step-seconds", "0.05"),
        "hook_config": HOOK_EVERY_STEP,
        "rules": [{"rule": CUSTOM_RULE, "name": "LossBlowup", "parameters": {"threshold": 1000},
                   "actions": [{"name": "stoptraining"}]}],
    }  # fmt: skip
    began = time.monotonic()
    status, body = api.request("POST", "/v1/jobs", spec)
    assert status == 201, body
    launcher = RayLauncher(ray_cluster.address)
    wait_for(lambda: launcher.node_of("ray-blowup", "rule:LossBlowup"), 90, "the rule runner's node")
    job = wait_for(lambda: (j := api.job("ray-blowup"))["status"] == "Stopped" and j, 180, "the rule to stop the job")
    took = time.monotonic() - began

    assert launcher.node_of("ray-blowup", "training") == ray_cluster.training_node
    assert launcher.node_of("ray-blowup", "rule:LossBlowup") == ray_cluster.rules_node
    assert job["rules"][0]["status"] == "IssuesFound", job["rules"][0]
    assert job["stop_cause"] == "rule LossBlowup found issues (stoptraining action)"
    training = {c["role"]: c for c in job["components"]}["training"]
    assert training["state"] == "Exited" and training["exit_code"] == 128 + signal.SIGTERM
    log = api.request("GET", "/v1/jobs/ray-blowup/logs?component=training")[1]
    assert "step 4" in log and "step 599" not in log  # stopped long before its 600 steps
    print(f"submit-to-Stopped through Ray: {took:.1f} s")


def test_sagemaker_endpoint_runs_a_faulty_job_on_ray(ray_cluster: RayCluster, api_factory, s3_endpoint) -> None:
    """CreateTrainingJob (boto3, SigV4) with the ray launcher: the SDK's stoptraining action stops it."""
    from tests.s3_server import s3_client
    from tests.services.test_sagemaker_endpoint import _request, _sdk_action_json

    bucket = s3_client(s3_endpoint)
    try:
        bucket.create_bucket(Bucket="bkt")
    except bucket.exceptions.BucketAlreadyOwnedByYou:
        pass
    api = api_factory(TRAINGUARD_LAUNCHER="ray", RAY_ADDRESS=ray_cluster.address, S3_ENDPOINT_URL=s3_endpoint,
                      TRAINGUARD_STOP_GRACE_SECONDS="5")  # fmt: skip
    client = api.sagemaker()
    name = "sm-on-ray"
    rules = [{"RuleConfigurationName": "LossBlowup", "RuleEvaluatorImage": "rules:latest",
              "RuleParameters": {"rule_to_invoke": CUSTOM_RULE, "threshold": "1000.0",
                                 "action_json": _sdk_action_json(name)}}]  # fmt: skip
    command = training_command("--steps", "600", "--blowup-at", "5", "--step-seconds", "0.05")
    client.create_training_job(**_request(name, command, rules))
    description = wait_for(
        lambda: (d := client.describe_training_job(TrainingJobName=name))["TrainingJobStatus"] == "Stopped" and d,
        180,
        "the faulty job to be Stopped",
    )
    assert description["DebugRuleEvaluationStatuses"][0]["RuleEvaluationStatus"] == "IssuesFound"
    launcher = RayLauncher(ray_cluster.address)
    assert launcher.node_of(name, "training") == ray_cluster.training_node
    assert launcher.node_of(name, "rule:LossBlowup") == ray_cluster.rules_node
    assert launcher.node_of(name, "uploader") is not None  # it ran somewhere on the cluster
    uploaded = wait_for(
        lambda: bucket.list_objects_v2(Bucket="bkt", Prefix=f"{name}/debug-output/").get("KeyCount", 0),
        30,
        "the uploader's copy in S3",
    )
    print(f"SageMaker job on Ray: {uploaded} objects uploaded to s3://bkt/{name}/debug-output/")


def _rule_submissions(address: str, job: str) -> list[Any]:
    """Every Ray job the launcher submitted for ``job``'s rules (groups and single rules), oldest first."""
    from ray.job_submission import JobSubmissionClient

    found = [info for info in JobSubmissionClient(address).list_jobs()
             if (info.metadata or {}).get("trainguard_job") == job
             and info.metadata.get("trainguard_role") not in ("training", "uploader")]  # fmt: skip
    return sorted(found, key=lambda info: int(info.metadata["trainguard_attempt"]))


def test_api_restart_and_a_lost_rule_node_lose_nothing(ray_cluster: RayCluster, api_factory) -> None:
    """Runs last: it kills a rules node (a spare one takes over). The job's three rules run as ONE
    Ray job (the rules group, one process); the node's death restarts that group once, not once per
    rule, and every rule resumes from its saved progress to its own right final status."""
    import sqlite3

    cluster = ray_cluster.cluster
    spare = _add_ready_node(ray_cluster, "rules")
    api = api_factory(TRAINGUARD_LAUNCHER="ray", RAY_ADDRESS=ray_cluster.address, TRAINGUARD_STOP_GRACE_SECONDS="5")
    steps = 900
    spec = {
        "name": "ray-survivor",
        "command": training_command("--steps", str(steps), "--step-seconds", "0.1"),
        "hook_config": HOOK_EVERY_STEP,
        "rules": [
            {"rule": CUSTOM_RULE, "name": "LossWatch", "parameters": {"threshold": 1000}},
            # the loss starts at 4.5 and falls below 4 within about 10 steps: found, no action
            {"rule": CUSTOM_RULE, "name": "LossHigh", "parameters": {"threshold": 4.0}},
            # another step range: evaluated beside the others in the same process, ends on its own
            {"rule": CUSTOM_RULE, "name": "LossEarly", "parameters": {"threshold": 1000, "end_step": 300}},
        ],
    }
    status, body = api.request("POST", "/v1/jobs", spec)
    assert status == 201, body
    launcher = RayLauncher(ray_cluster.address)
    rules = lambda: {r["configuration_name"]: r for r in api.job("ray-survivor")["rules"]}  # noqa: E731
    try:
        wait_for(lambda: (rules()["LossWatch"]["last_evaluated_step"] or -1) >= 100, 180, "100 evaluated steps")
    except AssertionError:
        print(api.job("ray-survivor"), launcher.status("ray-survivor"), launcher.logs("ray-survivor", "rule:LossWatch"),
              launcher.logs("ray-survivor", "training", tail=20), api.log_tail(), sep="\n----\n")  # fmt: skip
        raise
    [group] = _rule_submissions(ray_cluster.address, "ray-survivor")  # one Ray job for the three rules
    assert group.metadata["trainguard_role"] == "rules"
    assert json.loads(group.metadata["trainguard_rules"]) == ["rule:LossWatch", "rule:LossHigh", "rule:LossEarly"]
    assert set(launcher.status("ray-survivor")) == {"training", "rule:LossWatch", "rule:LossHigh", "rule:LossEarly"}

    api.kill(signal.SIGKILL)  # the API dies; the Ray jobs go on
    api.start()
    first = rules()["LossWatch"]["last_evaluated_step"]
    wait_for(lambda: rules()["LossWatch"]["last_evaluated_step"] > first, 60, "reports to the new API")

    # The rules node dies (no graceful shutdown): Ray fails the group without an exit code, the API
    # restarts it (once, whichever rule asked first), Ray places it on the other rules node, and
    # every rule resumes from the group's progress file.
    lost = launcher.node_of("ray-survivor", "rule:LossWatch")
    assert lost in (ray_cluster.rules_node, spare.node_id)
    assert {launcher.node_of("ray-survivor", f"rule:{name}") for name in ("LossHigh", "LossEarly")} == {lost}
    [node] = [n for n in cluster.worker_nodes if n.node_id == lost]
    killed_at = time.monotonic()
    cluster.remove_node(node, allow_graceful=False)
    survivor = spare.node_id if lost == ray_cluster.rules_node else ray_cluster.rules_node
    wait_for(lambda: "restart 1" in launcher.logs("ray-survivor", "rule:LossWatch"), 120, "the runner's restart")
    wait_for(lambda: launcher.node_of("ray-survivor", "rule:LossWatch") == survivor, 60, "the runner on the other node")
    print(f"rule node killed -> rules group resubmitted: {time.monotonic() - killed_at:.1f} s")
    assert launcher.status("ray-survivor")["training"].state is ComponentState.RUNNING  # training untouched

    job = wait_for(
        lambda: (
            (j := api.job("ray-survivor"))["status"] == "Completed"
            and all(r["status"] != "InProgress" for r in j["rules"]) and j
        ),
        300,
        "the job and its rules to finish",
    )
    final = {r["configuration_name"]: r for r in job["rules"]}
    assert final["LossWatch"]["status"] == "NoIssuesFound", final
    assert final["LossWatch"]["last_evaluated_step"] == steps - 1, final  # evaluated to the end: nothing lost
    assert final["LossHigh"]["status"] == "IssuesFound", final
    assert "at step 0 " in final["LossHigh"]["status_details"], final  # its first finding, kept across the restart
    assert final["LossEarly"]["status"] == "NoIssuesFound" and final["LossEarly"]["last_evaluated_step"] == 299, final
    assert launcher.node_of("ray-survivor", "training") == ray_cluster.training_node
    # The group was restarted once: attempts 0 and 1 of the one rules job, no Ray job per rule.
    attempts = _rule_submissions(ray_cluster.address, "ray-survivor")
    assert [(a.metadata["trainguard_role"], a.metadata["trainguard_attempt"]) for a in attempts] == [
        ("rules", "0"),
        ("rules", "1"),
    ]
    # Resumed, not started over: a step is evaluated again only if the kill came between its
    # evaluation and the next save of the progress (every 0.05 s); a restart from step 0 would
    # re-send 100+ datapoints per rule.
    with sqlite3.connect(api.data_dir / "trainguard.db") as db:
        rows = db.execute(
            "SELECT configuration_name, step, COUNT(*) FROM metric_data WHERE job_name='ray-survivor' "
            "AND metric_name='RuleIssuesFound' GROUP BY configuration_name, step"
        ).fetchall()
    evaluated: dict[str, int] = {}
    again: dict[str, int] = {}
    for name, _step, count in rows:
        evaluated[name] = evaluated.get(name, 0) + 1
        again[name] = again.get(name, 0) + count - 1
    assert evaluated == {"LossWatch": steps, "LossHigh": steps, "LossEarly": 300}, evaluated
    assert all(count < 30 for count in again.values()), again


def test_a_job_whose_training_node_dies_ends_failed_with_the_reason(ray_cluster: RayCluster, api_factory) -> None:
    """Runs last: it kills a training node."""
    cluster = ray_cluster.cluster
    _add_ready_node(ray_cluster, "training")
    api = api_factory(TRAINGUARD_LAUNCHER="ray", RAY_ADDRESS=ray_cluster.address, TRAINGUARD_STOP_GRACE_SECONDS="5")
    spec = {
        "name": "ray-node-lost",
        "command": training_command("--steps", "2000", "--step-seconds", "0.1"),
        "hook_config": HOOK_EVERY_STEP,
        "rules": [{"rule": CUSTOM_RULE, "name": "LossWatch", "parameters": {"threshold": 1000}}],
    }
    status, body = api.request("POST", "/v1/jobs", spec)
    assert status == 201, body
    launcher = RayLauncher(ray_cluster.address)
    wait_for(lambda: "step 3 " in launcher.logs("ray-node-lost", "training"), 120, "training to run")
    [node] = [n for n in cluster.worker_nodes if n.node_id == launcher.node_of("ray-node-lost", "training")]
    killed_at = time.monotonic()
    cluster.remove_node(node, allow_graceful=False)
    job = wait_for(lambda: (j := api.job("ray-node-lost"))["status"] == "Failed" and j, 120, "the job to fail")
    print(f"training node killed -> job Failed: {time.monotonic() - killed_at:.1f} s")
    assert job["exit_code"] == 137
    reason = job["failure_reason"]
    assert reason.startswith("AlgorithmError: training exited with code 137 (Ray: "), reason
    wait_for(lambda: api.job("ray-node-lost")["rules"][0]["status"] != "InProgress", 60, "the rule to end")


def test_settings_pick_the_ray_launcher_with_its_address_and_grace(tmp_path) -> None:
    from trainguard.services.api.app import make_launcher
    from trainguard.services.api.settings import Settings

    from trainguard.errors import ConfigError

    base = {"TRAINGUARD_API_TOKEN": "test-token-0123456789", "TRAINGUARD_DATA_DIR": str(tmp_path)}
    chosen = {"TRAINGUARD_LAUNCHER": "Ray", "RAY_ADDRESS": "http://head:8265", "TRAINGUARD_STOP_GRACE_SECONDS": "7.5"}
    settings = Settings.from_env({**base, **chosen})
    launcher = make_launcher(settings)  # connects lazily: no cluster needed to build it
    assert isinstance(launcher, RayLauncher)
    assert (launcher.name, launcher.address, launcher.stop_grace_seconds) == ("ray", "http://head:8265", 7.5)
    with pytest.raises(ConfigError, match="use local, docker or ray"):
        Settings.from_env({**base, "TRAINGUARD_LAUNCHER": "kubernetes"})


class _RecordingClient:
    """Ray's JobSubmissionClient as far as submit/list go: what the launcher submits, no cluster."""

    def __init__(self) -> None:
        self.submitted: list[dict[str, Any]] = []

    def submit_job(self, **kwargs: Any) -> str:
        self.submitted.append(kwargs)
        return kwargs["submission_id"]

    def list_jobs(self) -> list[Any]:
        from types import SimpleNamespace

        return [SimpleNamespace(submission_id=k["submission_id"], metadata=k["metadata"], entrypoint=k["entrypoint"],
                                runtime_env=k["runtime_env"], status="FAILED", driver_exit_code=None,
                                message="Job supervisor actor died")
                for k in self.submitted]  # fmt: skip


def test_planned_job_submissions_one_rules_group_and_the_uploader_finish_grace(tmp_path) -> None:
    """What the launcher submits for a planned job, without a cluster: the rules as one group
    carrying what differs per rule; the uploader with the reconciler's finish grace (Ray fixes a
    stop's grace at submission: with the job's 5 s, 'training ended, finish' SIGKILLed uploaders
    mid-upload under load and the API restarted them until their jobs failed, bench/scale.py
    20 x 5), kept when it is restarted."""
    from trainguard.services.api.planner import UPLOADER_FINISH_GRACE_S, plan_job
    from trainguard.services.api.schemas import JobSpec
    from trainguard.services.api.settings import Settings

    settings = Settings.from_env({"TRAINGUARD_API_TOKEN": "planner-token", "TRAINGUARD_DATA_DIR": str(tmp_path)})
    spec = JobSpec.model_validate({
        "name": "grouped", "command": ["true"], "hook_config": {"S3OutputPath": "s3://bkt/"},
        "rules": [{"rule": CUSTOM_RULE, "name": "A"}, {"rule": CUSTOM_RULE, "name": "B", "parameters": {"end_step": 9}}],
    })  # fmt: skip
    client = _RecordingClient()
    launcher = RayLauncher("http://unused:8265", stop_grace_seconds=5, client=client)
    launcher.start(plan_job(spec, settings, "ray", "t"))
    by_role = {k["metadata"]["trainguard_role"]: k for k in client.submitted}
    assert set(by_role) == {"training", "uploader", "rules"}
    group = by_role["rules"]
    assert group["entrypoint_resources"] == {"rules": 1}
    assert json.loads(group["metadata"]["trainguard_rules"]) == ["rule:A", "rule:B"]
    shared = group["runtime_env"]["env_vars"]
    assert shared["BASE_TRIAL"] == "s3://bkt/grouped/debug-output" and "RULE_CONFIGURATION_NAME" not in shared
    entries = json.loads(shared["TRAINGUARD_RULE_GROUP_JSON"])
    assert [e["environment"]["RULE_CONFIGURATION_NAME"] for e in entries] == ["A", "B"]
    assert "BASE_TRIAL" not in entries[0]["environment"]  # shared variables travel once
    grace = lambda role: by_role[role]["runtime_env"]["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"]  # noqa: E731
    assert (grace("training"), grace("rules"), grace("uploader")) == ("5", "5", str(int(UPLOADER_FINISH_GRACE_S)))
    launcher.start(plan_job(spec, settings, "ray", "t"))
    assert len(client.submitted) == 3  # idempotent, the group included
    launcher.restart("grouped", "uploader")
    launcher.restart("grouped", "rule:B")
    again = {k["metadata"]["trainguard_role"]: k for k in client.submitted[3:]}
    assert again["uploader"]["runtime_env"]["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"] == grace("uploader")
    assert again["rules"]["submission_id"] == "tg-grouped--rules--1"
    assert json.loads(again["rules"]["metadata"]["trainguard_rules"]) == ["rule:A", "rule:B"]
