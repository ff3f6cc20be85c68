"""Ray launcher: every component of a job is a Ray job, submitted through Ray's job API.

The job is planned as for the local launcher (commands run with this Python, the capture in
``<data dir>/jobs/<job>/debug-output``), so every Ray node must see the same Python environment
and that directory at the same path (one machine, or a shared filesystem; see docs/ray.md).

Placement is by Ray custom resources, not by host names:

* training asks for one unit of the ``training`` resource (plus the job's CPUs and memory), so
  it runs only on nodes started with ``ray start --resources '{"training": N}'``;
* each rule runner asks for one unit of the ``rules`` resource, so rule runners run only on
  nodes started with ``--resources '{"rules": N}'`` and never beside training (as SageMaker
  runs rule containers on their own instances);
* the uploader (an S3 copy of the shared capture directory) asks for nothing special.

A job's rule runners (components ``rule:<name>`` whose command is the rule runner) run as ONE Ray
job, the rules group (role ``rules`` in the submission's metadata, one unit of ``rules``): one
process evaluating every rule of the job over one read of each step (the rule runner's group mode,
TRAINGUARD_RULE_GROUP_JSON), each rule still reporting to the API on its own: one Ray job per rule
would cost a job supervisor, a driver and an interpreter per rule, and read every step once per
rule. To the API nothing changes: ``status()`` answers per rule role (the
group's state; once it ended, each rule's own exit code from the line the group prints for it),
``restart()`` of any of its roles resubmits the group once (every rule resumes from the group's
progress file; a no-op while the new attempt is pending), ``stop()`` naming any of its roles stops
the group (the reconciler only stops rules together: all those still in progress), and ``logs()``
of a rule role is the group's log. Rule components with another command run one Ray job each.

Training with several instances (``ComponentSpec.instance_count > 1``) or GPUs runs under the
``ray_ranks`` driver: a placement group, one bundle per instance (STRICT_SPREAD), one process per
instance with the torch.distributed rendezvous and SageMaker's host view (see ray_ranks.py).

Everything the launcher knows lives in Ray: each submission carries ``trainguard_*`` metadata
(job, role, attempt), so a restarted API (a new :class:`RayLauncher`) finds its jobs again with
``jobs()``/``status()``; a restart of a component is a new submission (Ray never reuses a
submission id) and ``logs()`` joins the attempts.

Stop: Ray's job API sends SIGTERM to the entrypoint's process tree and SIGKILL after
``RAY_JOB_STOP_WAIT_TIME_S``, which Ray reads from the job's environment. That grace is fixed
when the job is submitted (``stop_grace_seconds``, the API's TRAINGUARD_STOP_GRACE_SECONDS, or
the component's own ``stop_grace_seconds`` when longer: the uploader's, whose "training ended,
finish" stop must not SIGKILL it mid-upload after a few seconds);
a stop asking for a shorter grace still gets SIGTERM at once, the SIGKILL comes after the
submitted grace (Ray's job API has no per-stop grace).
"""

from __future__ import annotations

import json
import math
import re
import shlex
import sys
import threading
import time
from typing import Any

from trainguard.services.launchers.base import (
    ComponentSpec,
    ComponentState,
    ComponentStatus,
    JobLaunch,
    LauncherError,
    LauncherSupport,
    read_host_file,
)

__all__ = ["RayLauncher"]

_JOB_KEY = "trainguard_job"
_ROLE_KEY = "trainguard_role"
_ATTEMPT_KEY = "trainguard_attempt"
_PLACEMENT_KEY = "trainguard_placement"  # the submit options (resources) as JSON, for restart()
_GROUP_KEY = "trainguard_rules"  # a rules group's rule roles, as a JSON list
_GROUP_ROLE = "rules"
_RULE_PREFIX = "rule:"
_RULE_RUNNER_MODULE = "trainguard.services.rule_runner"
_GROUP_ENV = "TRAINGUARD_RULE_GROUP_JSON"  # what the rule runner's group mode reads (rule_runner/__main__.py)
_EXIT_LINE = re.compile(r"^trainguard rule group: (\S+) exit (-?\d+)\s*$", re.MULTILINE)
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
# A killed process's conventional code: a component that ended without an exit code of its own
# (its node or its Ray supervisor died) reads as killed, so the API restarts a rule runner and
# fails training with Ray's message as the reason.
_KILLED_CODE = 137
_STOPPED_CODE = 128 + 15  # stopped through Ray: SIGTERM, as a local stop


def _submission_id(job_name: str, role: str, attempt: int) -> str:
    return f"tg-{job_name}--{_SAFE.sub('_', role.replace(':', '-'))}--{attempt}"


class RayLauncher:
    """Runs each component as a Ray job on a Ray cluster (``address``: the dashboard URL, e.g.
    ``http://head:8265``, or anything ``JobSubmissionClient`` takes, such as ``auto``)."""

    name = "ray"
    support = LauncherSupport(max_instance_count=64)  # several instances run under ray_ranks

    def __init__(
        self,
        address: str | None = None,
        *,
        stop_grace_seconds: float = 120.0,
        training_resource: str = "training",
        rules_resource: str = "rules",
        client: Any = None,
        listing_ttl_seconds: float = 0.25,
    ) -> None:
        self.address = address
        self.stop_grace_seconds = stop_grace_seconds
        self.training_resource = training_resource
        self.rules_resource = rules_resource
        self._client = client
        # One listing of the cluster's jobs serves every status() of a reconcile tick (the API
        # polls each unsettled job in turn); anything this launcher changes drops it.
        self.listing_ttl_seconds = listing_ttl_seconds
        self._listing: tuple[float, list[Any]] | None = None
        self._listing_lock = threading.Lock()
        self._codes: dict[str, dict[str, int]] = {}  # ended rules group -> each rule's exit code

    # -- the Ray job client ---------------------------------------------------------------------
    @property
    def client(self) -> Any:
        """Connected lazily: the API starts even when the cluster is not up yet."""
        if self._client is None:
            try:
                from ray.job_submission import JobSubmissionClient
            except ImportError as error:  # the optional extra
                raise LauncherError("the ray launcher needs Ray: pip install 'trainguard[ray]'") from error
            try:
                self._client = JobSubmissionClient(self.address)
            except Exception as error:  # noqa: BLE001 - connection errors come in many types
                raise LauncherError(f"cannot reach the Ray cluster at {self.address or 'auto'}: {error}") from error
        return self._client

    def _call(self, what: str, function: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except LauncherError:
            raise
        except Exception as error:  # noqa: BLE001 - Ray raises RuntimeError, requests errors...
            raise LauncherError(f"Ray job API: {what} failed: {error}") from error

    def _list_jobs(self) -> list[Any]:
        with self._listing_lock:
            if self._listing is not None and time.monotonic() - self._listing[0] < self.listing_ttl_seconds:
                return self._listing[1]
        listed_at = time.monotonic()
        listing = list(self._call("list_jobs", self.client.list_jobs))
        with self._listing_lock:
            self._listing = (listed_at, listing)
        return listing

    def _forget_listing(self) -> None:
        with self._listing_lock:
            self._listing = None

    def _submissions(self, job_name: str | None = None) -> list[Any]:
        """Every trainguard submission (of ``job_name``), oldest attempt first."""
        found = []
        for info in self._list_jobs():
            metadata = info.metadata or {}
            if _JOB_KEY not in metadata or (job_name is not None and metadata[_JOB_KEY] != job_name):
                continue
            found.append(info)
        found.sort(key=lambda info: int((info.metadata or {}).get(_ATTEMPT_KEY, "0")))
        return found

    def _latest_by_role(self, job_name: str) -> dict[str, Any]:
        """The latest submission of each component role: a rules group's under each of its rules."""
        latest: dict[str, Any] = {}
        for info in self._submissions(job_name):
            for role in _roles_of(info):
                latest[role] = info  # sorted by attempt: the last one wins
        return latest

    def _group_codes(self, info: Any) -> dict[str, int]:
        """Each rule's exit code, from the lines an ended rules group printed (cached: it ended)."""
        with self._listing_lock:
            known = self._codes.get(info.submission_id)
        if known is not None:
            return known
        try:
            text = self._call(f"logs of {info.submission_id}", self.client.get_job_logs, info.submission_id) or ""
        except LauncherError:
            text = ""  # a dead node's log is gone (for good): the group's own status stands for every rule
        codes = {role: int(code) for role, code in _EXIT_LINE.findall(text)}
        with self._listing_lock:
            if len(self._codes) > 4096:
                self._codes.clear()
            self._codes[info.submission_id] = codes
        return codes

    # -- placement ------------------------------------------------------------------------------
    @staticmethod
    def _runs_ranks(component: ComponentSpec) -> bool:
        """Training that runs under the ray_ranks driver: several instances, or GPUs. A GPU job as
        a plain Ray job would wait PENDING, silently and unstoppable (Ray queues a stop until the
        job's supervisor is placed); the driver says in the job's log what it waits for, and a
        stop ends it at once."""
        return component.role == "training" and (component.instance_count > 1 or bool(component.gpus))

    def _bundle(self, component: ComponentSpec) -> dict[str, float]:
        """One training instance's Ray resources: a placement-group bundle (ray_ranks)."""
        bundle: dict[str, float] = {self.training_resource: 1, "CPU": component.cpus or 1}
        if component.gpus:
            bundle["GPU"] = component.gpus
        if component.memory_mb:
            bundle["memory"] = int(component.memory_mb) * 1024 * 1024
        return bundle

    def _resources(self, component: ComponentSpec) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self._runs_ranks(component):
            # The driver (ray_ranks) only coordinates; the instances' resources are its bundles.
            return {"entrypoint_num_cpus": 0}
        if component.role == "training":
            options["entrypoint_resources"] = {self.training_resource: 1}
        elif component.role.startswith(_RULE_PREFIX) or component.role == _GROUP_ROLE:
            options["entrypoint_resources"] = {self.rules_resource: 1}
        if component.cpus:
            options["entrypoint_num_cpus"] = component.cpus
        if component.gpus:
            options["entrypoint_num_gpus"] = component.gpus
        if component.memory_mb:
            options["entrypoint_memory"] = int(component.memory_mb) * 1024 * 1024
        return options

    def _entrypoint(self, component: ComponentSpec) -> str:
        if not component.command:
            raise LauncherError(f"component {component.role!r} has no command (the ray launcher runs no images)")
        argv = list(component.command)
        if self._runs_ranks(component):
            argv = [
                sys.executable, "-m", "trainguard.services.launchers.ray_ranks",
                "--instances", str(component.instance_count), "--bundle", json.dumps(self._bundle(component)),
                *(["--cwd", component.working_dir] if component.working_dir else []), "--", *argv,
            ]  # fmt: skip
        command = "exec " + shlex.join(argv)  # exec: Ray's SIGTERM reaches the command itself
        if component.working_dir:
            # mkdir as the local launcher does; cd in the shell rather than runtime_env working_dir,
            # which would upload the directory as a package instead of running in it.
            directory = shlex.quote(component.working_dir)
            command = f"mkdir -p {directory} && cd {directory} && {command}"
        return command

    def _submit(
        self,
        job_name: str,
        role: str,
        attempt: int,
        entrypoint: str,
        env_vars: dict[str, str],
        options: dict,
        group: list[str] | None = None,
        grace_seconds: float | None = None,
    ) -> None:
        grace = max(self.stop_grace_seconds, grace_seconds or 0.0)
        env_vars = {**env_vars, "RAY_JOB_STOP_WAIT_TIME_S": str(max(0, math.ceil(grace)))}
        self._call(
            f"submit {role} of {job_name}",
            self.client.submit_job,
            entrypoint=entrypoint,
            submission_id=_submission_id(job_name, role, attempt),
            runtime_env={"env_vars": env_vars},
            # Ray's job listing does not give the entrypoint resources back: keep them for restart().
            metadata={
                _JOB_KEY: job_name,
                _ROLE_KEY: role,
                _ATTEMPT_KEY: str(attempt),
                _PLACEMENT_KEY: json.dumps(options),
                **({_GROUP_KEY: json.dumps(group)} if group is not None else {}),
            },
            **options,
        )
        self._forget_listing()  # the next status() sees the new submission

    # -- the rules group --------------------------------------------------------------------------
    @staticmethod
    def _groupable(component: ComponentSpec) -> bool:
        """A rule runner (``<python> -m trainguard.services.rule_runner``): it can run in the group."""
        return component.role.startswith(_RULE_PREFIX) and tuple(component.command[1:]) == ("-m", _RULE_RUNNER_MODULE)

    @staticmethod
    def _group(components: list[ComponentSpec]) -> ComponentSpec:
        """One component running ``components`` (rule runners) in one process: the variables they
        all share are its own, the group's list carries what differs per rule (a process's
        environment is bounded: 128 KiB per variable on Linux). It asks
        for the most CPUs any of them asked (the rules are evaluated one after the other) and the
        memory they asked together."""
        environments = [{key: str(value) for key, value in c.environment.items()} for c in components]
        shared = {key: value for key, value in environments[0].items()
                  if all(other.get(key) == value for other in environments[1:])}  # fmt: skip
        entries = [
            {"role": c.role, "environment": {key: value for key, value in e.items() if shared.get(key) != value}}
            for c, e in zip(components, environments, strict=True)
        ]
        cpus = [c.cpus for c in components if c.cpus]
        memory = [c.memory_mb for c in components if c.memory_mb]
        return ComponentSpec(
            role=_GROUP_ROLE,
            image=components[0].image,
            command=components[0].command,
            environment={**shared, _GROUP_ENV: json.dumps(entries)},
            cpus=max(cpus) if cpus else None,
            memory_mb=sum(memory) if memory else None,
            working_dir=components[0].working_dir,
        )

    # -- Launcher interface ---------------------------------------------------------------------
    def start(self, job: JobLaunch) -> None:
        if not job.job_name or _SAFE.search(job.job_name):
            raise LauncherError(f"job name {job.job_name!r} is not usable in a Ray submission id")
        known = self._latest_by_role(job.job_name)
        new = [component for component in job.components if component.role not in known]  # start() is idempotent
        rules = [c for c in new if self._groupable(c)]
        rules = [c for c in rules if c.working_dir == rules[0].working_dir]  # one group: one directory
        submissions = [c for c in new if all(c is not rule for rule in rules)]
        if rules:
            submissions.append(self._group(rules))
        for component in submissions:
            group = json.loads(component.environment[_GROUP_ENV]) if component.role == _GROUP_ROLE else None
            self._submit(
                job.job_name,
                component.role,
                0,
                self._entrypoint(component),
                {key: str(value) for key, value in component.environment.items()},
                self._resources(component),
                [entry["role"] for entry in group] if group is not None else None,
                component.stop_grace_seconds,
            )

    def status(self, job_name: str) -> dict[str, ComponentStatus]:
        statuses = {}
        for role, info in self._latest_by_role(job_name).items():
            status = self._status_of(role, info)
            if _GROUP_KEY in info.metadata and status.state is ComponentState.EXITED:
                code = self._group_codes(info).get(role)
                if code is not None and code != status.exit_code:
                    # the rule's own end; the group's (a stop, a kill) stands when it printed none
                    status = ComponentStatus(role, ComponentState.EXITED, code, "")
            statuses[role] = status
        return statuses

    @staticmethod
    def _status_of(role: str, info: Any) -> ComponentStatus:
        state = str(getattr(info.status, "value", info.status))
        if state == "PENDING":
            return ComponentStatus(role, ComponentState.PENDING)
        if state == "RUNNING":
            return ComponentStatus(role, ComponentState.RUNNING)
        if state == "SUCCEEDED":
            return ComponentStatus(role, ComponentState.EXITED, 0)
        if state == "STOPPED":
            return ComponentStatus(role, ComponentState.EXITED, _STOPPED_CODE, "stopped through Ray (SIGTERM)")
        code = getattr(info, "driver_exit_code", None)
        message = (info.message or "").strip().splitlines()
        if code is not None:
            # Ray's message is the log tail; the API reads the log itself, so keep the reason short.
            return ComponentStatus(role, ComponentState.EXITED, code, "")
        reason = f"Ray: {message[0] if message else 'the job failed without an exit code'}"
        return ComponentStatus(role, ComponentState.EXITED, _KILLED_CODE, reason[:500])

    def stop(self, job_name: str, roles: tuple[str, ...] | None = None, grace_seconds: float = 120.0) -> None:
        stopped: set[str] = set()
        for role, info in self._latest_by_role(job_name).items():
            if roles is not None and role not in roles or info.submission_id in stopped:
                continue
            if self._status_of(role, info).state in (ComponentState.PENDING, ComponentState.RUNNING):
                self._call(f"stop {role} of {job_name}", self.client.stop_job, info.submission_id)
                stopped.add(info.submission_id)  # a rules group once, whichever of its rules named it
                self._forget_listing()

    def restart(self, job_name: str, role: str) -> None:
        info = self._latest_by_role(job_name).get(role)
        if info is None:
            raise LauncherError(f"job {job_name!r} has no component {role!r} to restart")
        if self._status_of(role, info).state is not ComponentState.EXITED:
            return
        options = json.loads(info.metadata.get(_PLACEMENT_KEY) or "{}")
        env_vars = dict((info.runtime_env or {}).get("env_vars") or {})
        attempt = int(info.metadata.get(_ATTEMPT_KEY, "0")) + 1
        group = json.loads(info.metadata[_GROUP_KEY]) if _GROUP_KEY in info.metadata else None
        submitted_grace = float(env_vars.get("RAY_JOB_STOP_WAIT_TIME_S") or 0)  # the component's own, if longer
        # A rules group is resubmitted whole, once: its other rules then see the new attempt pending.
        self._submit(job_name, info.metadata[_ROLE_KEY], attempt, info.entrypoint, env_vars, options, group,
                     submitted_grace)  # fmt: skip

    def read_file(self, job_name: str, role: str, path: str, max_bytes: int) -> bytes | None:
        """The local plan's files are on the data directory every node shares: ``path`` is a path here."""
        return read_host_file(path, max_bytes)

    def logs(self, job_name: str, role: str = "training", tail: int | None = None) -> str:
        attempts = [info for info in self._submissions(job_name) if role in _roles_of(info)]
        parts = []
        for number, info in enumerate(attempts):
            if number:
                what = role if _GROUP_KEY not in info.metadata else f"{role} (the rules group)"
                parts.append(f"trainguard launcher: restarting {what} (restart {number})\n")
            try:
                parts.append(self._call(f"logs of {role}", self.client.get_job_logs, info.submission_id) or "")
            except LauncherError as error:
                # Ray serves a log from the node that ran it: a dead node's logs are gone, the
                # later attempts' are still worth reading.
                first_line = str(error).strip().splitlines()[0][:300]
                parts.append(f"trainguard launcher: the log of {info.submission_id} is unavailable ({first_line})\n")
        text = "".join(parts)
        if tail is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-tail:]) if tail > 0 else ""
        return text

    def jobs(self) -> list[str]:
        return sorted({info.metadata[_JOB_KEY] for info in self._submissions()})

    def remove(self, job_name: str) -> None:
        submissions = self._submissions(job_name)
        running = sorted(
            {
                role
                for info in submissions
                if self._status_of(info.metadata[_ROLE_KEY], info).state is not ComponentState.EXITED
                for role in _roles_of(info)
            }
        )
        if running:
            raise LauncherError(f"job {job_name} still has running components: {', '.join(running)}; stop it first")
        for info in submissions:
            self._call(f"delete {info.submission_id}", self.client.delete_job, info.submission_id)
        self._forget_listing()

    def node_of(self, job_name: str, role: str) -> str | None:
        """The Ray node id the component's latest attempt runs (ran) on: where placement put it."""
        info = self._latest_by_role(job_name).get(role)
        return getattr(info, "driver_node_id", None) if info is not None else None


def _roles_of(info: Any) -> list[str]:
    """The component roles a submission runs: a rules group's rules, else its one role."""
    metadata = info.metadata or {}
    if _GROUP_KEY in metadata:
        try:
            return [str(role) for role in json.loads(metadata[_GROUP_KEY])]
        except (ValueError, TypeError):
            pass
    return [metadata[_ROLE_KEY]]
