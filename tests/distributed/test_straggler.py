"""Straggler: one rank of a synchronous job much slower than the others, from per-rank step timings.

Synthetic timings built as a synchronous job produces them: every rank's step lasts as long as
the slowest rank's own work, the others wait the difference inside their backward."""

from __future__ import annotations

import numpy as np
import pytest

from tests.distributed._torchrun import dumps, rule_output, torchrun_job
from trainguard.profiler.reader import StepTiming
from trainguard.rules import RuleSpec, create_rule


def _timings(own: np.ndarray, rank_backward: np.ndarray | None = None) -> list[StepTiming]:
    """``own[s, r]``: rank r's work outside the backward at step s (data, forward, optimizer);
    ``rank_backward[s, r]``: its backward's own compute (default 1 ms). The step lasts as long as
    the slowest rank's work; a faster rank waits the rest in its backward (the all-reduce)."""
    steps, ranks = own.shape
    backward = np.full_like(own, 0.001) if rank_backward is None else rank_backward
    duration = (own + backward).max(axis=1)
    start, timings = 1.8e9, []
    for s in range(steps):
        for r in range(ranks):
            timings.append(StepTiming(node="host", rank=r, mode="TRAIN", step=s, start=start,
                                      duration=float(duration[s]),
                                      data=float(own[s, r]) / 2, forward=float(own[s, r]) / 2,
                                      backward=float(duration[s] - own[s, r]), optimizer=0.0))  # fmt: skip
        start += float(duration[s])
    return timings


def _judge(tmp_path, timings: list[StepTiming], spec: str = "Straggler"):
    rule = create_rule(str(tmp_path), RuleSpec.parse(spec))
    rule.on_steps(timings)
    return rule.assess(None, final=True)


def _oracle(own: np.ndarray, threshold: float = 0.5, window: int = 10) -> list[int]:
    step = np.median(own[-window:].max(axis=1) + 0.001)
    late = []
    for r in range(own.shape[1]):
        excess = own[-window:, r] - np.median(np.delete(own[-window:], r, axis=1), axis=1)
        if np.median(excess) > threshold * step:
            late.append(r)
    return late


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_rank_three_times_slower_is_named(tmp_path, ranks):
    rng = np.random.default_rng(ranks)
    own = rng.uniform(0.009, 0.011, size=(30, ranks))
    own[:, ranks - 1] *= 3  # that rank's steps take 3x as long as the others'
    own[[22, 25, 27], ranks - 1] = 0.01  # and a few of its steps are as fast as theirs
    assert _oracle(own) == [ranks - 1]
    result = _judge(tmp_path, _timings(own))
    assert result.fired and result.details["rank"] == ranks - 1, result.message
    assert f"rank {ranks - 1} on host is a straggler" in result.message
    assert not result.certain  # a cost, never a reason to stop


def test_jitter_and_a_rank_only_somewhat_slower_stay_silent(tmp_path):
    rng = np.random.default_rng(0)
    for factor in (1.0, 1.3):
        own = rng.uniform(0.008, 0.012, size=(30, 2))
        own[:, 1] *= factor
        assert _oracle(own) == []
        result = _judge(tmp_path, _timings(own))
        assert result.fired is False and not result.not_evaluated, (factor, result.message)


def test_a_rank_slow_in_its_backward_only_is_not_told_apart(tmp_path):
    """Its extra time lands where the others wait: documented as what the rule cannot see."""
    own = np.full((30, 2), 0.01)
    backward = np.full((30, 2), 0.001)
    backward[:, 1] = 0.03
    assert _judge(tmp_path, _timings(own, backward)).fired is False


def test_one_rank_or_too_few_steps_is_not_evaluated(tmp_path):
    assert _judge(tmp_path, _timings(np.full((30, 1), 0.01))).not_evaluated
    assert "fewer than 10 steps" in _judge(tmp_path, _timings(np.full((5, 2), 0.01))).not_evaluated


@pytest.mark.slow
def test_a_real_rank_three_times_slower_is_named(tmp_path):
    """2-rank torchrun gloo job whose steps work 20 ms each; rank 1 sleeps twice its own step
    time after each step (its steps take 3x as long); the healthy twin is
    tests/distributed/test_teardown.py's run. Without the 20 ms the model's own step is under a
    millisecond, and on a loaded machine the scheduler's delays hid the slow rank (NoIssuesFound)."""
    record = torchrun_job(tmp_path, "--slow", "1:3", "--step-time", "0.02", "--epochs", "2")
    assert not record["hung"] and record["returncode"] == 0, (record, dumps(tmp_path))  # reported, never stopped
    document = rule_output(tmp_path, "Straggler")
    assert document["status"] == "IssuesFound", document
    (finding,) = document["findings"]
    assert "rank 1 on" in finding["message"] and finding["details"]["rank"] == 1, finding


def test_no_timings_of_the_judged_mode_is_not_evaluated(tmp_path):
    result = _judge(tmp_path, _timings(np.full((30, 2), 0.01)), "Straggler:mode=EVAL")
    assert "no step timings of EVAL steps" in result.not_evaluated
