"""A rank that stops writing steps while the others go on (issue 48 item 3): StalledTrainingRule
names it and the last step it wrote; a job whose ranks all stall names the ranks behind."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.distributed._torchrun import dumps, rule_output, torchrun_job
from tests.rules.synthetic import open_trial, write_run
from trainguard.format.layout import worker_name
from trainguard.modes import ModeKeys
from trainguard.rules import create_rule
from trainguard.storage import open_store
from trainguard.writer.thread import StepWriter


def _write_steps(run: str, rank: int, steps: range) -> None:
    writer = StepWriter(open_store(run), worker_name(rank))
    for step in steps:
        writer.begin_step(step, ModeKeys.TRAIN, step)
        writer.add_tensor("CrossEntropyLoss_output_0", np.full(1, 1.0 / (step + 1)), nbytes=8)
        writer.end_step()
    assert writer.close(timeout=30)


def _two_rank_run(tmp_path) -> str:
    run = write_run(tmp_path / "live", {0: {"CrossEntropyLoss_output_0": 1.0}}, finished=False)  # worker_0
    _write_steps(run, 1, range(1))
    return run


def test_a_rank_that_stops_while_the_other_goes_on_is_named_with_its_last_step(tmp_path):
    run = _two_rank_run(tmp_path)
    rule = create_rule(open_trial(run), "StalledTrainingRule:threshold=60")
    now = time.time()
    assert rule.check_idle(now) is None
    _write_steps(run, 0, range(1, 4))  # rank 0 goes on to step 3, rank 1 stays at step 0
    assert rule.check_idle(now + 30) is None
    assert rule.check_idle(now + 59) is None  # rank 1 idle 59 s: under the threshold
    found = rule.check_idle(now + 61)
    assert found is not None and found.fired and not found.certain
    assert found.worker == "worker_1" and found.step == 0
    assert found.details["stalled_worker"] == "worker_1" and found.details["others_newest_step"] == 3
    assert "worker_1 wrote no new step for 61 s since its step 0 appeared" in found.message
    assert rule.check_idle(now + 70) is None  # once per threshold of its stall
    # then the whole job stalls (rank 0 waits for rank 1): the job finding names the rank behind
    job = rule.check_idle(now + 30 + 61)
    assert job is not None and job.worker == "worker_1" and job.step == 3
    assert job.details["workers_behind"] == {"worker_1": 0}
    assert "behind the other workers: worker_1 (last step 0)" in job.message


def test_ranks_that_write_steps_together_are_not_stalled(tmp_path):
    run = _two_rank_run(tmp_path)
    rule = create_rule(open_trial(run), "StalledTrainingRule:threshold=60")
    now = time.time()
    for second, step in zip(range(0, 600, 50), range(1, 100), strict=False):
        _write_steps(run, 0, range(step, step + 1))
        assert rule.check_idle(now + second) is None  # rank 1 a step behind for a moment
        _write_steps(run, 1, range(step, step + 1))
        assert rule.check_idle(now + second + 1) is None


def test_a_rank_that_stopped_alone_is_not_blamed_once_every_rank_stalls_equally(tmp_path):
    run = _two_rank_run(tmp_path)  # both ranks at step 0, neither goes on
    rule = create_rule(open_trial(run), "StalledTrainingRule:threshold=60")
    now = time.time()
    assert rule.check_idle(now) is None
    job = rule.check_idle(now + 61)
    assert job is not None and job.worker is None and job.details["workers_behind"] == {}
    assert "behind" not in job.message


@pytest.mark.slow
def test_a_real_rank_that_sleeps_is_named_as_the_one_the_job_waits_for(tmp_path):
    """2-rank torchrun gloo DDP job, every step saved; rank 1 sleeps 30 s before its step 8. Rank 0
    wrote its step 7 and waits in step 8's all-reduce; rank 1 never closed its step 7 (a step is
    written when the next one begins). Up to then the ranks wrote their steps together: no finding."""
    record = torchrun_job(tmp_path, "--sleep-at", "1:8:30",
                          trainguard="--rules StalledTrainingRule:threshold=10 --stop-on-issue --save-interval 1")
    assert not record["hung"] and record["returncode"] == 0, (record, dumps(tmp_path))  # never certain: not stopped
    document = rule_output(tmp_path, "StalledTrainingRule")
    assert document["status"] == "IssuesFound", document
    findings = document["findings"]
    # Every finding names worker_1. Two kinds may come, in either order by how loaded the machine
    # is: the job's stall (no new step since step 7, worker_1 behind at 6), and, when rank 0's
    # step 7 appeared seconds after rank 1's step 6 (a loaded machine), worker_1's own stall at its
    # step 6 while worker_0 went on.
    assert findings and all(finding["worker"] == "worker_1" for finding in findings), findings
    job_stalls = [finding for finding in findings if "workers_behind" in finding["details"]]
    own_stalls = [finding for finding in findings if "stalled_worker" in finding["details"]]
    assert job_stalls and len(job_stalls) + len(own_stalls) == len(findings), findings
    assert all(finding["step"] == 7 for finding in job_stalls), job_stalls
    assert all(finding["step"] == 6 and finding["details"]["others_newest_step"] == 7 for finding in own_stalls)
    assert job_stalls[0]["details"]["workers_behind"] == {"worker_1": 6}, job_stalls[0]
    assert "behind the other workers: worker_1 (last step 6)" in job_stalls[0]["message"]
