"""LocalLauncher with real processes: groups, logs, stop with grace then SIGKILL, recovery from files."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from trainguard.services.launchers.base import ComponentSpec, ComponentState, JobLaunch, LauncherError
from trainguard.services.launchers.local import LocalLauncher
from tests.services.conftest import wait_for
from tests.services.job_users import needs_root, traversable_for_jobs


def _python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def _job(name: str, *components: ComponentSpec) -> JobLaunch:
    return JobLaunch(name, components)


def test_exit_codes_logs_and_environment(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    launcher.start(
        _job(
            "job-a",
            ComponentSpec(
                "training",
                "",
                _python("import os; print('hello', os.environ['GREETING']); raise SystemExit(3)"),
                environment={"GREETING": "world"},
            ),  # fmt: skip
            ComponentSpec("rule:R1", "", _python("print('rule ok')")),
        )
    )
    statuses = wait_for(
        lambda: (s := launcher.status("job-a")) and all(c.state is ComponentState.EXITED for c in s.values()) and s,
        30, "both components to exit",
    )  # fmt: skip
    assert statuses["training"].exit_code == 3
    assert statuses["rule:R1"].exit_code == 0
    assert "hello world" in launcher.logs("job-a", "training")
    assert launcher.logs("job-a", "rule:R1", tail=1) == "rule ok\n"
    assert launcher.jobs() == ["job-a"]
    launcher.start(_job("job-a", ComponentSpec("training", "", _python("raise SystemExit(9)"))))  # idempotent
    assert launcher.status("job-a")["training"].exit_code == 3
    launcher.remove("job-a")
    assert launcher.jobs() == [] and launcher.status("job-a") == {}


def test_stop_sigterms_the_group_then_kills_after_the_grace(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    # A child that ignores SIGTERM, started by the component: the whole group must go.
    stubborn = "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print('up', flush=True); time.sleep(60)"  # fmt: skip
    polite = "import time; print('up', flush=True); time.sleep(60)"
    launcher.start(
        _job("job-b", ComponentSpec("training", "", _python(stubborn)), ComponentSpec("rule:R", "", _python(polite)))
    )
    wait_for(
        lambda: launcher.logs("job-b", "training").startswith("up") and launcher.logs("job-b", "rule:R"), 20, "start"
    )
    pid = int((tmp_path / "job-b" / "training" / "pid").read_text().split()[0])
    assert os.getpgid(pid) == pid  # its own process group
    started = time.monotonic()
    launcher.stop("job-b", grace_seconds=1.0)
    rule = wait_for(
        lambda: (s := launcher.status("job-b")["rule:R"]).state is ComponentState.EXITED and s, 10, "the rule to exit"
    )
    assert rule.exit_code == 143 and rule.reason == "killed by SIGTERM"
    training = wait_for(
        lambda: (s := launcher.status("job-b")["training"]).state is ComponentState.EXITED and s, 20, "the SIGKILL"
    )
    assert time.monotonic() - started >= 1.0
    assert training.exit_code == 137
    assert training.reason == "killed by SIGKILL after 1 s grace"
    # The grandchild went with its group.
    wait_for(lambda: not any(_is_sleeper(p) for p in Path("/proc").glob("[0-9]*")), 10, "the grandchild to be gone")


def _is_sleeper(proc: Path) -> bool:
    try:
        return b"time.sleep(60)" in (proc / "cmdline").read_bytes() and b"signal" not in (proc / "cmdline").read_bytes()
    except OSError:
        return False


def test_a_new_launcher_recovers_jobs_and_exits_that_happened_while_nobody_watched(tmp_path: Path) -> None:
    first = LocalLauncher(tmp_path)
    first.start(
        _job("job-c", ComponentSpec("training", "", _python("import time; time.sleep(1.0); raise SystemExit(5)")))
    )
    assert first.status("job-c")["training"].state is ComponentState.RUNNING
    del first  # the API process that started it is gone; the wrapper records the exit anyway
    time.sleep(1.5)
    second = LocalLauncher(tmp_path)
    assert second.jobs() == ["job-c"]
    status = wait_for(
        lambda: (s := second.status("job-c")["training"]).state is ComponentState.EXITED and s, 20, "exit"
    )
    assert status.exit_code == 5


def test_a_pending_stop_deadline_survives_a_launcher_restart(tmp_path: Path) -> None:
    first = LocalLauncher(tmp_path)
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    )
    first.start(_job("job-d", ComponentSpec("training", "", _python(stubborn))))
    wait_for(lambda: first.logs("job-d", "training"), 20, "start")
    first.stop("job-d", grace_seconds=0.5)
    second = LocalLauncher(tmp_path)  # a restarted API enforces the deadline from the kill_at file
    status = wait_for(
        lambda: (s := second.status("job-d")["training"]).state is ComponentState.EXITED and s, 20, "the kill"
    )
    assert status.exit_code == 137


def test_a_job_has_its_own_process_group_in_the_launchers_session(tmp_path: Path) -> None:
    """Not its own session: the kernel's autogroup scheduling shares the CPU equally between
    sessions whatever their niceness, so 100 jobs in 100 sessions starved the API
    (bench/load_api.py, create p50 1.4-2.8 s). In the API's session the job's niceness applies."""
    launcher = LocalLauncher(tmp_path, niceness=10)
    sleeper = _python("import time; print('up', flush=True); time.sleep(30)")
    launcher.start(_job("job-s", ComponentSpec("training", "", sleeper)))
    wait_for(lambda: "up" in launcher.logs("job-s", "training"), 30, "the job to start")
    pid = int(next((tmp_path / "job-s").glob("*/pid")).read_text().split()[0])
    try:
        assert os.getpgid(pid) == pid  # stop() signals this group: the whole tree
        assert os.getsid(pid) == os.getsid(0)
        assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0) + 10
    finally:
        launcher.stop("job-s", None, 0)


_REPORT = "import json, os; print(json.dumps({'environment': dict(os.environ), 'cwd': os.getcwd(), 'uid': os.getuid()}))"


def _report(launcher: LocalLauncher, job: str) -> dict:
    wait_for(lambda: launcher.status(job)["training"].state is ComponentState.EXITED, 30, "the report")
    assert launcher.status(job)["training"].exit_code == 0, launcher.logs(job)
    return json.loads(launcher.logs(job).splitlines()[-1])


def test_a_job_gets_none_of_the_launchers_environment_and_runs_in_its_own_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = {
        "TRAINGUARD_API_TOKEN": "the-api-token-0123456789",
        "TRAINGUARD_DATABASE_URL": "postgresql+psycopg://api:db-password@db/trainguard",
        "TRAINGUARD_SAGEMAKER_ACCESS_KEYS": "k=AKIATGKEY0000000001:key-secret-0123456789",
        "AWS_SECRET_ACCESS_KEY": "the-apis-aws-secret",
        "SOME_SETTING_OF_THE_API": "an-api-setting-value",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.chdir(tmp_path)
    launcher = LocalLauncher(tmp_path / "local")
    workspace = tmp_path / "jobs" / "job-env"
    own = {"OWN_VARIABLE": "mine", "TRAINGUARD_API_TOKEN": "the-jobs-runner-token"}
    launcher.start(JobLaunch("job-env", (ComponentSpec("training", "", _python(_REPORT), environment=own,
                                                       working_dir="rel/dir"),), workspace=str(workspace)))  # fmt: skip
    report = _report(launcher, "job-env")
    environment = report["environment"]
    assert environment["OWN_VARIABLE"] == "mine"
    assert environment["TRAINGUARD_API_TOKEN"] == "the-jobs-runner-token"  # its own, given in its spec
    assert "SOME_SETTING_OF_THE_API" not in environment and "AWS_SECRET_ACCESS_KEY" not in environment
    for value in secrets.values():
        assert value not in str(environment)
    assert environment["PATH"] == os.environ["PATH"] and environment["LC_ALL"] == "C.UTF-8"
    assert environment["HOME"] == str(workspace) and environment["TMPDIR"] == str(workspace / "tmp")
    assert (workspace / "tmp").is_dir()
    assert report["cwd"] == str(workspace / "rel" / "dir")  # the workspace's, not the launcher's cwd
    assert not (tmp_path / "rel").exists()


def test_a_relative_working_dir_may_not_climb_out_of_the_workspace(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path / "local")
    escaping = ComponentSpec("training", "", _python("pass"), working_dir="../../outside")
    with pytest.raises(LauncherError, match=r"working_dir '\.\./\.\./outside' must not contain '\.\.'"):
        launcher.start(JobLaunch("job-up", (escaping,), workspace=str(tmp_path / "jobs" / "job-up")))
    assert not (tmp_path / "outside").exists()


def test_the_operator_may_pass_more_variables_but_never_the_services_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINGUARD_JOB_ENV_PASSTHROUGH", "HF_HOME, TRAINGUARD_API_TOKEN")
    with pytest.raises(LauncherError, match="TRAINGUARD_API_TOKEN"):
        LocalLauncher(tmp_path / "refused")
    monkeypatch.setenv("TRAINGUARD_JOB_ENV_PASSTHROUGH", "HF_HOME")
    monkeypatch.setenv("HF_HOME", "/models")
    launcher = LocalLauncher(tmp_path / "local")
    launcher.start(_job("job-pass", ComponentSpec("training", "", _python(_REPORT))))
    assert _report(launcher, "job-pass")["environment"]["HF_HOME"] == "/models"


@needs_root
def test_as_root_a_job_runs_as_its_own_user_and_keeps_it_across_a_restart(tmp_path: Path) -> None:
    import stat
    import tempfile

    with traversable_for_jobs():
        state = Path(tempfile.mkdtemp(prefix="tg-launcher-"))
        try:
            os.chmod(state, 0o711)
            launcher = LocalLauncher(state / "local")
            assert launcher.isolation.available, launcher.isolation.unavailable
            launcher.start(_job("job-u1", ComponentSpec("training", "", _python(_REPORT))))
            launcher.start(_job("job-u2", ComponentSpec("training", "", _python(_REPORT))))
            first, second = _report(launcher, "job-u1"), _report(launcher, "job-u2")
            assert first["uid"] != 0 and second["uid"] != 0 and first["uid"] != second["uid"]
            workspace = state / "local" / "job-u1" / "workspace"
            assert workspace.stat().st_uid == first["uid"] and stat.S_IMODE(workspace.stat().st_mode) == 0o700
            component_dir = state / "local" / "job-u1" / "training"
            assert component_dir.stat().st_uid == 0 and stat.S_IMODE(component_dir.stat().st_mode) == 0o700
            launcher.restart("job-u1", "training")
            wait_for(lambda: launcher.logs("job-u1").count('"uid"') == 2, 30, "the restarted component")
            restarted = wait_for(
                lambda: (s := launcher.status("job-u1")["training"]).state is ComponentState.EXITED and s, 20, "exit"
            )
            assert restarted.exit_code == 0
            assert json.loads(launcher.logs("job-u1").splitlines()[-1])["uid"] == first["uid"]
            # A stop from the launcher reaches a job running as another user.
            sleeper = ComponentSpec("training", "", _python("import time; print('up', flush=True); time.sleep(60)"))
            launcher.start(_job("job-u3", sleeper))
            wait_for(lambda: "up" in launcher.logs("job-u3"), 30, "the sleeper")
            launcher.stop("job-u3", grace_seconds=1.0)
            stopped = wait_for(
                lambda: (s := launcher.status("job-u3")["training"]).state is ComponentState.EXITED and s, 20, "stop"
            )
            assert stopped.exit_code == 143
        finally:
            import shutil

            shutil.rmtree(state, ignore_errors=True)


def test_a_command_that_cannot_start_is_reported(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    launcher.start(_job("job-x", ComponentSpec("training", "", ("/no/such/program", "--flag"))))
    status = wait_for(
        lambda: (s := launcher.status("job-x")["training"]).state is ComponentState.EXITED and s, 20, "the failure"
    )
    assert status.exit_code == 127
    assert "cannot start '/no/such/program'" in status.reason and "No such file" in status.reason
    assert "cannot start '/no/such/program'" in launcher.logs("job-x")


def test_the_service_creates_files_in_a_workspace_without_following_the_jobs_links(tmp_path: Path) -> None:
    """How the reconciler writes a missing end marker into a job's directory, which the job owns."""
    from trainguard.services.launchers.local_isolation import create_in_workspace

    outside = tmp_path / "outside"
    outside.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "debug-output").symlink_to(outside)  # the job pointed its output elsewhere
    with pytest.raises(OSError):
        create_in_workspace(linked, "debug-output", "training_job_end.ts")
    dangling = tmp_path / "dangling"
    (dangling / "debug-output").mkdir(parents=True)
    (dangling / "debug-output" / "training_job_end.ts").symlink_to(outside / "created-by-the-service")
    assert create_in_workspace(dangling, "debug-output", "training_job_end.ts") is False
    assert list(outside.iterdir()) == []

    plain = tmp_path / "plain"
    plain.mkdir()
    assert create_in_workspace(plain, "debug-output", "training_job_end.ts") is True
    assert (plain / "debug-output" / "training_job_end.ts").is_file()
    assert create_in_workspace(plain, "debug-output", "training_job_end.ts") is False  # there already
