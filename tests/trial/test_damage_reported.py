"""A damaged run is reported by the trial API and by ``trainguard rules run``, never judged as if
it were whole: an index stripped of its checksums with an altered payload, a missing index and a
truncated index, on a run written by trainguard's own PyTorch hook (which declares, in its
collections file, that it checksums every payload)."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import trainguard.pytorch as tg  # noqa: E402
from trainguard.errors import ChecksumMissing  # noqa: E402
from trainguard.format.layout import collections_key, event_key, index_key  # noqa: E402
from trainguard.trial import create_trial  # noqa: E402

STEPS = 6
LOSS = "MSELoss_output_0"


@pytest.fixture(scope="module")
def hook_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run written by the PyTorch hook: every step saves weights, gradients, the loss."""
    run = tmp_path_factory.mktemp("hook") / "run"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    hook = tg.Hook(out_dir=str(run), include_collections=["weights", "gradients", "losses"],
                   save_config=tg.SaveConfig(save_interval=1))  # fmt: skip
    hook.register_module(model)
    loss_fn = torch.nn.MSELoss()
    hook.register_loss(loss_fn)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(32, 4)
    targets = inputs.sum(dim=1, keepdim=True)
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
    hook.close()
    return run


@pytest.fixture
def run(hook_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(hook_run, copy)
    return copy


def _strip_checksums_and_alter(run: Path, step: int, name: str) -> tuple[float, float]:
    """What corruption plus a careless repair do: the index loses its crc32 keys and three bytes
    of the payload's float change. Returns the value before and after."""
    index_file = run / index_key(step, "worker_0")
    document = json.loads(index_file.read_text())
    for entry in document["tensor_payload"]:
        del entry["crc32"]
    index_file.write_text(json.dumps(document))
    entry = next(e for e in document["tensor_payload"] if e["tensorname"] == name)
    event_file = run / event_key(step, "worker_0")
    data = bytearray(event_file.read_bytes())
    end = entry["start_idx"] + entry["length"] - 4  # the payload ends before the 4-byte footer
    before = struct.unpack("<f", data[end - 4 : end])[0]
    data[end - 3] ^= 0x5A
    data[end - 2] ^= 0x3C
    data[end - 1] ^= 0x7A
    event_file.write_bytes(bytes(data))
    return before, struct.unpack("<f", data[end - 4 : end])[0]


def _rules_run(run: Path, tmp_path: Path, *rules: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "trainguard.cli", "rules", "run", str(run), "--output-dir", str(tmp_path / "out")]
    for rule in rules:
        command += ["--rule", rule]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_a_hook_run_declares_that_it_checksums_every_payload(hook_run: Path) -> None:
    meta = json.loads((hook_run / collections_key("worker_0")).read_text())["_meta"]
    assert meta["payload_checksums"] == "crc32"
    trial = create_trial(hook_run)
    assert trial.payload_checksums_required and trial.damage() == [] and trial.steps() == list(range(STEPS))


def test_stripped_checksums_with_an_altered_payload_are_damage_not_a_value(run: Path) -> None:
    before, after = _strip_checksums_and_alter(run, 3, LOSS)
    assert before != after
    trial = create_trial(run)
    [damage] = trial.damage()
    assert (damage.step, damage.worker, damage.key) == (3, "worker_0", index_key(3, "worker_0"))
    assert "without the run's payload checksum" in damage.problem
    assert list(trial.damaged_steps()) == [3]
    with pytest.raises(ChecksumMissing, match="no crc32"):
        trial.tensor(LOSS).value(3)
    # the other steps read as before
    assert np.isfinite(trial.tensor(LOSS).value(4)).all()


def test_rules_run_exits_non_zero_naming_the_damaged_step_and_file(run: Path, tmp_path: Path) -> None:
    _strip_checksums_and_alter(run, 3, LOSS)
    result = _rules_run(run, tmp_path, "ExplodingTensor")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("trainguard rules: damaged:")]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"trainguard rules: damaged: step 3 of worker_0: {run}/{index_key(3, 'worker_0')}: ")
    assert "without the run's payload checksum" in lines[0] and repr(LOSS) in lines[0]
    verdict = json.loads((tmp_path / "out" / "rule-output" / "ExplodingTensor.json").read_text())
    assert verdict["status"] == "Error" and verdict["status_details"].startswith("RunDamaged: step 3 of worker_0")


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_missing_or_truncated_index_is_reported_not_skipped(run: Path, tmp_path: Path, damage: str) -> None:
    index_file = run / index_key(2, "worker_0")
    if damage == "missing":
        index_file.unlink()
        key, problem = event_key(2, "worker_0"), "event file without an index"
    else:
        text = index_file.read_text()
        index_file.write_text(text[: len(text) // 2])
        key, problem = index_key(2, "worker_0"), "unreadable index file"
    trial = create_trial(run)
    assert [(item.step, item.key) for item in trial.damage()] == [(2, key)]
    assert problem in trial.damaged_steps()[2][0]
    assert 2 not in trial.steps()

    result = _rules_run(run, tmp_path, "ExplodingTensor")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"trainguard rules: damaged: step 2 of worker_0: {run}/{key}: {problem}" in result.stdout
    assert "RunDamaged: step 2 of worker_0 is damaged" in result.stdout


def test_an_intact_hook_run_still_passes(hook_run: Path, tmp_path: Path) -> None:
    result = _rules_run(hook_run, tmp_path, "ExplodingTensor")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "damaged" not in result.stdout


class _ApiRecorder(http.server.BaseHTTPRequestHandler):
    """The API's internal rule-status endpoint, recording each report."""

    reports: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        length = int(self.headers.get("Content-Length") or 0)
        type(self).reports.append({"path": self.path, **json.loads(self.rfile.read(length))})
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


def test_the_services_rule_runner_reports_the_damage_to_the_api(run: Path, tmp_path: Path) -> None:
    """``python -m trainguard.services.rule_runner`` (a job's rule container) on a damaged run: its
    final report to the API is Error naming the step and file, and it exits 2 (Error)."""
    _strip_checksums_and_alter(run, 3, LOSS)
    _ApiRecorder.reports = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ApiRecorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        environment = {
            **os.environ,
            "TRAINING_JOB_NAME": "damaged-job",
            "RULE_CONFIGURATION_NAME": "Exploding",
            "RULE_TO_INVOKE": "ExplodingTensor",
            "BASE_TRIAL": str(run),
            "RULE_OUTPUT_DIR": str(tmp_path / "out"),
            "RULE_OUTBOX_DIR": str(tmp_path / "outbox"),
            "RULE_REPORT_BATCH_S": "0",
            "TRAINGUARD_API_URL": f"http://127.0.0.1:{server.server_address[1]}",
            "TRAINGUARD_API_TOKEN": "runner-token",
        }
        result = subprocess.run([sys.executable, "-m", "trainguard.services.rule_runner"], env=environment,
                                capture_output=True, text=True, timeout=300)  # fmt: skip
    finally:
        server.shutdown()
    assert result.returncode == 2, result.stdout + result.stderr
    statuses = [report for report in _ApiRecorder.reports if report.get("status")]
    assert statuses and statuses[-1]["status"] == "Error", statuses
    details = statuses[-1]["status_details"]
    assert details.startswith("RunDamaged: step 3 of worker_0 is damaged: index/000000000/000000000003_worker_0.json")
    assert all(report["path"] == "/v1/internal/jobs/damaged-job/rules/Exploding/status" for report in statuses)


def test_the_summary_names_each_damaged_file_with_its_step(run: Path) -> None:
    from trainguard.summary import describe_run, render_summary

    _strip_checksums_and_alter(run, 3, LOSS)
    (run / index_key(5, "worker_0")).unlink()
    facts = describe_run(create_trial(run))
    assert [(item["step"], item["file"]) for item in facts["damaged"]] == [
        (3, index_key(3, "worker_0")), (5, event_key(5, "worker_0"))
    ]
    lines = [line for line in render_summary(facts).splitlines() if line.startswith("  damaged     : ")]
    assert lines[0].startswith(f"  damaged     : step 3 of worker_0: {index_key(3, 'worker_0')}: index entries without")
    assert lines[1] == (
        f"  damaged     : step 5 of worker_0: {event_key(5, 'worker_0')}: "
        "event file without an index: step 5 of worker_0 is missing"
    )


def test_an_index_that_lands_behind_the_listing_is_read_not_reported(run: Path) -> None:
    """An endpoint emptied and filled again (the stack's S3 restarted, the uploader re-sending)
    can put a step's index back after later steps were listed: at the end marker the reader
    reads it, and the step is whole, not damage."""
    late = run / index_key(2, "worker_0")
    held = late.read_bytes()
    late.unlink()
    end_marker = run / "training_job_end.ts"
    end_marker.unlink()
    trial = create_trial(str(run))
    trial.refresh()  # live: lists past step 2, whose index is not there yet
    assert 2 not in trial.steps()
    late.write_bytes(held)
    end_marker.write_text("")
    trial.refresh()
    assert trial.damage() == []
    assert 2 in trial.steps()
    assert np.isfinite(trial.tensor(LOSS).value(2))
