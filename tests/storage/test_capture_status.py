"""A capture_stopped record the run refuses is kept beside it, where trials find it; and a store's
errors say what the disk did (read-only is not "permission denied")."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from trainguard.errors import StorageError
from trainguard.format.layout import CAPTURE_STATUS_DIR_VARIABLE
from trainguard.storage import LocalStore, MemoryStore
from trainguard.storage.capture_status import read_capture_status_aside, write_capture_status_aside
from trainguard.storage.local import _storage_error
from trainguard.writer.thread import StepWriter

RECORD = json.dumps({"step": 44, "reason": "StorageError: the file system is read-only", "time": 1.0}).encode()


class _ReadOnlyStore(MemoryStore):
    """A store that stopped taking writes (a file system remounted read-only)."""

    refuse = False

    def write(self, key: str, data: object) -> None:
        if self.refuse:
            raise StorageError(f"cannot create {key}: the file system is read-only")
        super().write(key, data)  # type: ignore[arg-type]


def test_a_refused_record_is_kept_beside_the_run_and_read_back(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(CAPTURE_STATUS_DIR_VARIABLE, str(tmp_path))
    assert write_capture_status_aside("/runs/a/", "capture_stopped/worker_0.json", RECORD, OSError("ro"))
    found = read_capture_status_aside("/runs/a", tmp_path)
    assert list(found) == ["worker_0"] and found["worker_0"]["step"] == 44
    assert found["worker_0"]["recorded_aside"] == "the run refused it: ro"
    assert read_capture_status_aside("/runs/b", tmp_path) == {}  # another run's directory: nothing
    assert read_capture_status_aside("/runs/a", None) == {}


def test_without_a_status_directory_nothing_is_written(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(CAPTURE_STATUS_DIR_VARIABLE, raising=False)
    assert not write_capture_status_aside("/runs/a", "capture_stopped/worker_0.json", RECORD, OSError("ro"))


def test_the_writer_keeps_the_record_aside_when_the_store_refuses_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(CAPTURE_STATUS_DIR_VARIABLE, str(tmp_path))
    store = _ReadOnlyStore("ro-run")
    writer = StepWriter(store, "worker_0")
    writer.close()
    store.refuse = True
    writer.write_after_failure([("capture_stopped/worker_0.json", RECORD), ("training_job_end.ts", b"")])
    assert read_capture_status_aside(store.url, tmp_path)["worker_0"]["reason"].endswith("read-only")


def test_a_trial_reads_the_record_kept_beside_its_run(tmp_path: Path, monkeypatch) -> None:
    from tests.trial.test_trial_live import write_steps
    from trainguard.modes import ModeKeys
    from trainguard.trial import create_trial

    run, status = tmp_path / "run", tmp_path / "status"
    status.mkdir()
    write_steps(LocalStore(run), [(0, ModeKeys.TRAIN, 0)])
    monkeypatch.setenv(CAPTURE_STATUS_DIR_VARIABLE, str(status))
    assert create_trial(run).capture_stopped() == {}
    write_capture_status_aside(str(LocalStore(run).url), "capture_stopped/worker_0.json", RECORD, OSError("ro"))
    assert create_trial(run).capture_stopped()["worker_0"]["step"] == 44


@pytest.mark.parametrize(
    ("code", "said"),
    [
        (errno.EROFS, "the file system is read-only"),
        (errno.ENOSPC, "the disk is full"),
        (errno.EACCES, "permission denied"),
    ],
)
def test_local_store_errors_say_what_the_disk_did(code: int, said: str) -> None:
    assert said in str(_storage_error("create", Path("/run/x"), OSError(code, "os text")))
