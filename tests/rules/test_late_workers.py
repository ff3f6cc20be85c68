"""Workers a reader does not wait for, whose files land late: nothing they wrote is skipped.

Under ``include_workers="one"`` worker 0 declares one worker (readers wait for it alone) and the
other ranks still write their losses. Seen on a 2-instance job on Ray (tests/services/
test_ray_multinode.py, under load): worker_1's index files reached S3 after worker 0's last ones;
the reader's listing had moved past their keys and the rule ended NoIssuesFound on a loss of 1e6.
These runs are written by the real step writer into a store, in the order S3 received them.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from trainguard.config.collections import CollectionManager
from trainguard.format.layout import END_OF_TRAINING, collections_key
from trainguard.modes import ModeKeys
from trainguard.rules import RuleSpec, RuleStatus
from trainguard.rules.runner import RuleRunner
from trainguard.storage import LocalStore, MemoryStore, Store
from trainguard.trial import Trial
from trainguard.writer.thread import StepWriter

LOSS = "OffsetMSELoss_output_0"
RULE = "tests.services.rules_for_tests:LossAboveThreshold"
STEPS = range(10)


def _write_losses(store: Store, worker: str, losses: dict[int, float], *, end: bool = False) -> None:
    writer = StepWriter(store, worker)
    writer.write_object(collections_key(worker), CollectionManager.pytorch_defaults().render(1))
    for step, loss in losses.items():
        writer.begin_step(step, ModeKeys.TRAIN, step)
        writer.add_tensor(LOSS, np.array(loss, np.float32), nbytes=4)
        writer.end_step()
    if end:
        writer.write_object(END_OF_TRAINING, b"")
    assert writer.close()


def _rank_1_losses() -> dict[int, float]:
    return {step: 1e6 if step >= 6 else 1.0 for step in STEPS}


@pytest.mark.parametrize("end_with_them", [False, True], ids=["then-end", "end-in-same-listing"])
def test_a_worker_listed_after_worker_0_finished_is_read_whole(end_with_them: bool) -> None:
    store = MemoryStore()
    _write_losses(store, "worker_0", {step: 1.0 for step in STEPS})
    trial = Trial(store)
    assert trial.steps() == list(STEPS) and trial.workers() == ["worker_0"]
    _write_losses(store, "worker_1", _rank_1_losses(), end=end_with_them)
    if not end_with_them:
        trial.refresh(force=True)
        store.write(END_OF_TRAINING, b"")
    trial.refresh(force=True)
    assert trial.training_ended
    loss = trial.tensor(LOSS)
    assert [step for step in STEPS if "worker_1" in loss.workers(step)] == list(STEPS)
    assert float(loss.value(7, worker="worker_1")) == 1e6
    assert trial._state.unindexed_event_files == {}


def test_a_rule_evaluates_a_worker_whose_steps_land_after_its_cursor_passed_them(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "run"))
    _write_losses(store, "worker_0", {step: 1.0 for step in STEPS})
    progress = tmp_path / "progress.json"
    spec = RuleSpec(RULE, {"threshold": "1000"}, configuration_name="LossAboveThreshold")
    runner = RuleRunner(str(tmp_path / "run"), [spec], poll_interval=0.05, progress_file=str(progress),
                        output_dir=str(tmp_path / "out"))  # fmt: skip
    final: dict = {}
    thread = threading.Thread(target=lambda: final.update(runner.run()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (runner.progress and runner.progress["LossAboveThreshold"].last_evaluated_step == STEPS[-1]):
        assert time.monotonic() < deadline, "worker 0's steps were not evaluated within 60 s"
        time.sleep(0.02)
    _write_losses(store, "worker_1", _rank_1_losses(), end=True)
    thread.join(60)
    assert not thread.is_alive()
    update = final["LossAboveThreshold"]
    assert update.status == RuleStatus.ISSUES_FOUND, update
    findings = json.loads((tmp_path / "out" / "rule-output" / "LossAboveThreshold.json").read_text())["findings"]
    assert {(f["step"], f["worker"]) for f in findings} == {(step, "worker_1") for step in (6, 7, 8, 9)}
    saved = json.loads(progress.read_text())
    assert saved["rules"]["LossAboveThreshold"]["worker_steps"] == {"worker_0": 9, "worker_1": 9}


def test_a_restarted_runner_does_not_evaluate_workers_again(tmp_path: Path) -> None:
    """The per-worker steps are saved: a restart evaluates nothing twice, also from a progress
    file written before they existed (its workers count as evaluated up to its cursor)."""
    run = tmp_path / "run"
    store = LocalStore(str(run))
    _write_losses(store, "worker_0", {step: 1.0 for step in STEPS})
    _write_losses(store, "worker_1", _rank_1_losses(), end=True)
    progress = tmp_path / "progress.json"
    spec = RuleSpec(RULE, {"threshold": "1000"}, configuration_name="LossAboveThreshold")
    assert RuleRunner(str(run), [spec], progress_file=str(progress)).run()["LossAboveThreshold"].status == (
        RuleStatus.ISSUES_FOUND
    )
    evaluated: list[tuple[int, str | None]] = []

    class Counting(RuleRunner):
        def _record(self, name, result):  # type: ignore[no-untyped-def]
            if result is not None:
                evaluated.append((result.step, result.worker))
            super()._record(name, result)

    saved = json.loads(progress.read_text())
    rules = saved["rules"]
    rules["LossAboveThreshold"]["finished"] = False  # as if it had stopped before finish()
    progress.write_text(json.dumps(saved))
    Counting(str(run), [spec], progress_file=str(progress)).run()
    assert evaluated == []
    del rules["LossAboveThreshold"]["worker_steps"]  # a file from before worker_steps existed
    progress.write_text(json.dumps(saved))
    evaluated.clear()
    Counting(str(run), [spec], progress_file=str(progress)).run()
    assert evaluated == []


def test_a_stopped_worker_does_not_make_every_listing_start_at_its_last_step(monkeypatch) -> None:
    """Past the lag bound the live listing stops waiting for a worker; after the end marker the
    reader still lists from the start once, so a straggler's late steps are found."""
    from trainguard.trial import state

    monkeypatch.setattr(state, "_MAX_WORKER_LAG_STEPS", 3)
    store = MemoryStore()
    _write_losses(store, "worker_1", {0: 1.0})
    _write_losses(store, "worker_0", {step: 1.0 for step in STEPS})
    trial = Trial(store)
    trial.refresh(force=True)
    assert trial._state._token is not None and trial._state._token > "index/000000000/000000000005"
    _write_losses(store, "worker_1", {1: 1.0, 2: 5.0}, end=True)
    trial.refresh(force=True)
    assert [step for step in STEPS if "worker_1" in trial.tensor(LOSS).workers(step)] == [0, 1, 2]
