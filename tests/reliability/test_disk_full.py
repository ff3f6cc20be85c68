"""The training disk fills up mid-run (a real tmpfs of a few MiB under the capture directory, filled
by a ballast file and left full): training must go on without capture, nothing written before may
be lost on its way to S3, and the job must end Completed with the steps written evaluated; the
rule's verdict is RuleNotEvaluated for the rest, naming where and why capture stopped.

Needs root (``mount -t tmpfs``); skipped with the reason otherwise. Before the uploader kept its
state in memory when it could not save it, the uploader died of ENOSPC, the job was failed, the
training SIGTERMed and the files written since the last upload never reached S3.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from trainguard.services.launchers.base import ComponentSpec, JobLaunch
from trainguard.services.launchers.local import LocalLauncher

from tests.polling import wait_for
from tests.reliability.faults import (
    RestartableS3,
    fill_disk,
    local_run_files,
    mount_small_disk,
    s3_run_files,
    unmount,
    uploader_command,
    wait_for_capture,
)  # fmt: skip
from tests.s3_server import DUMMY_CREDENTIALS
from tests.services.conftest import CUSTOM_RULE, HOOK_EVERY_STEP, REPO, training_command
from trainguard.format.layout import END_OF_TRAINING

STEPS = 300
RULE_FINAL = {"NoIssuesFound", "IssuesFound", "Error", "Stopped"}


def test_full_training_disk_stops_capture_but_not_training_and_loses_nothing(api_factory, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs as the training disk")
    api = api_factory()
    job = "disk-full"
    run = api.data_dir / "jobs" / job / "debug-output"
    try:
        mount_small_disk(run)
    except OSError as error:
        pytest.skip(str(error))
    s3 = RestartableS3(tmp_path / "moto.log")
    try:
        s3.start()
        s3.client().create_bucket(Bucket="runs")
        spec = {"name": job, "hook_config": HOOK_EVERY_STEP,
                "command": training_command("--steps", str(STEPS), "--step-seconds", "0.05"),
                "rules": [{"rule": CUSTOM_RULE, "name": "Loss", "parameters": {"threshold": 1e30}}]}  # fmt: skip
        assert api.request("POST", "/v1/jobs", spec)[0] == 201
        command = uploader_command(run, f"s3://runs/{job}/debug-output", s3.endpoint)
        LocalLauncher(api.data_dir / "local").start(
            JobLaunch(job, (ComponentSpec("uploader", "", tuple(command), dict(DUMMY_CREDENTIALS)),))
        )
        wait_for_capture(run)
        wait_for(lambda: len(s3_run_files(s3.client(), "runs", f"{job}/debug-output")) >= 10, 60, "uploads")
        assert fill_disk(run) > 0
        ended = wait_for(
            lambda: (j := api.job(job))["status"] != "InProgress" and j["rules"][0]["status"] in RULE_FINAL and j,
            180, "the job and its rule to end",
        )  # fmt: skip

        training = api.data_dir / "local" / job / "training"
        assert (training / "exit_code").read_text().split()[0] == "0"  # training never crashed
        assert "capture disabled" in (training / "output.log").read_text()  # the hook's fail-open line
        assert ended["status"] == "Completed", ended
        local = local_run_files(run)
        on_s3 = s3_run_files(s3.client(), "runs", f"{job}/debug-output")
        assert END_OF_TRAINING in on_s3
        assert not set(local) - set(on_s3), sorted(set(local) - set(on_s3))  # nothing written was lost
        steps_written = sum(1 for key in local if key.startswith("index/"))
        assert 0 < steps_written < STEPS  # the disk really filled mid-run
        # the hook said so in the space it held back, and the verdict says what was not seen
        assert "capture_stopped/worker_0.json" in on_s3
        rule = ended["rules"][0]
        assert rule["status"] == "Error", rule
        assert rule["status_details"].startswith("RuleNotEvaluated: evaluated up to step"), rule
        assert "capture stopped early on worker_0" in rule["status_details"] and "disk is full" in rule["status_details"]
        assert rule["last_evaluated_step"] == steps_written - 1, (rule, steps_written)
    finally:
        s3.kill()
        unmount(run)


def test_upload_state_that_cannot_be_saved_is_kept_in_memory_and_saved_later(tmp_path: Path) -> None:
    """Without root: the state's directory is a file for a while (any OSError on save, as ENOSPC)."""
    from trainguard.services.uploader.state import UploadState

    blocked = tmp_path / "state-dir"
    blocked.write_text("not a directory")
    state = UploadState(blocked / ".uploader-state.json", "s3://runs/x")
    state.record("events/a.tfevents", 10, 1)
    state.flush()  # cannot be written: no exception, the record stays
    assert state.is_current("events/a.tfevents", 10, 1) and not (blocked / ".uploader-state.json").exists()
    blocked.unlink()
    state.flush()  # room again: the pending record is saved
    assert UploadState(blocked / ".uploader-state.json", "s3://runs/x").is_current("events/a.tfevents", 10, 1)


def _trainguard_run(out: Path, *training: str, rules: bool = False) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "trainguard.cli", "run", "--out", str(out), "--save-interval", "1"]
    command += ["--rules"] if rules else []
    command += ["--", *training]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _remount_read_only(directory: Path) -> subprocess.CompletedProcess[str] | None:
    result = subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], capture_output=True, text=True)
    return result if result.returncode == 0 or "busy" not in result.stderr else None


def _trainguard_lines(output: str) -> list[str]:
    """What trainguard (not the training script, which prints 'step N loss ...') wrote."""
    return [line for line in output.splitlines() if not line.startswith("step ")]


def test_a_full_disk_is_one_line_in_the_training_log_and_told_in_the_summary(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs as the capture disk")
    run = tmp_path / "run"
    try:
        mount_small_disk(run, mib=1)
    except OSError as error:
        pytest.skip(str(error))
    try:
        process = _trainguard_run(run, *training_command("--steps", str(STEPS)))
        output, _ = process.communicate(timeout=300)
    finally:
        unmount(run)
    assert process.returncode == 0, output  # training never noticed
    lines = _trainguard_lines(output)
    assert "Traceback" not in output, output
    warnings = [line for line in lines if "capture disabled" in line]
    assert len(warnings) == 1 and "the disk is full" in warnings[0], lines
    capture = [line for line in lines if line.startswith("  capture     : STOPPED EARLY")]
    assert len(capture) == 1 and "the disk is full" in capture[0], lines
    assert not [line for line in lines if line.startswith("  damaged")], lines  # the step cut short left no orphan


def test_a_read_only_remount_is_told_in_the_summary_and_the_rules(tmp_path: Path) -> None:
    """The run directory is remounted read-only mid-run: the hook cannot even write its
    capture_stopped record there, so it keeps it beside the run (trainguard run's status
    directory); the summary says where capture stopped and why, and no rule says NoIssuesFound."""
    if os.geteuid() != 0:
        pytest.skip("needs root to bind-mount and remount the run directory read-only")
    run = tmp_path / "run"
    run.mkdir()
    if subprocess.run(["mount", "--bind", str(run), str(run)], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here")
    process = _trainguard_run(run, *training_command("--steps", "600", "--step-seconds", "0.03"), rules=True)
    try:
        wait_for(lambda: len(list((run / "index").rglob("*.json"))) >= 20 or None, 120, "20 saved steps")
        # The kernel refuses (EBUSY) while a file of the mount is open for writing: the writer
        # streams each step into a temp file, so retry until the remount falls between two.
        remount = wait_for(lambda: _remount_read_only(run), 60, "a read-only remount", interval=0.02)
        assert remount.returncode == 0, remount.stderr
        saved_before = len(list((run / "index").rglob("*.json")))
        output, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        unmount(run)
    assert process.returncode == 0, output
    lines = _trainguard_lines(output)
    assert "Traceback" not in output, output
    warnings = [line for line in lines if "capture disabled" in line]
    assert len(warnings) == 1 and "read-only" in warnings[0], lines
    [capture] = [line for line in lines if line.startswith("  capture     : STOPPED EARLY")]
    assert "read-only" in capture and "worker_0 captured nothing from step" in capture, lines
    step = int(capture.split("from step ")[1].split()[0])
    assert saved_before <= step + 1 < 600, (saved_before, step)
    assert any("finished    : training ended, but its capture stopped early" in line for line in lines), lines
    verdicts = [line for line in lines if line.startswith("    ")]
    assert verdicts and not [line for line in verdicts if "NoIssuesFound" in line], verdicts
    assert any(f"capture stopped early on worker_0 at step {step}" in line for line in verdicts), verdicts
    assert sum("cannot save rule progress" in line for line in lines) <= 1, lines
