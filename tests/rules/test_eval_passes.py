"""Overfit and Overtraining compare whole validation passes, never one batch against another.

Observed: a healthy Hugging Face ``Trainer`` run with evaluation every epoch was stopped by
Overfit (certain) at epoch 5: saved every 10th EVAL step, each 8-batch pass kept one batch at a
different position, and the rule compared those. Reproduced here without transformers
(tests/rules/_eval_pass_runs.py: validation called as the Trainer does, batches that get harder
with their position): the hook now saves the losses of every step of a pass (bounded), the rules
compare pass means, and passes that are not comparable are never compared ("not evaluated").
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import trainguard.pytorch as tg  # noqa: E402
from tests.rules import _eval_pass_runs as runs  # noqa: E402
from tests.rules.synthetic import evaluate_rule, first_firing, write_run  # noqa: E402
from trainguard.hooks.eval_passes import EvalPassSaves  # noqa: E402
from trainguard.modes import ModeKeys  # noqa: E402
from trainguard.rules.builtin._eval_passes import PassSplitter, declared_eval_pass_steps  # noqa: E402

RULES = ("Overfit", "Overtraining")


def _eval_steps(trial) -> list[tuple[int, int]]:
    return [(step, trial.mode_step(step)) for step in trial.steps() if trial.mode(step) == ModeKeys.EVAL]


# -- the hook: every step of a pass, bounded ---------------------------------------------------


def test_the_hook_saves_every_eval_step_of_each_pass_at_interval_10(tmp_path):
    trial = runs.train(str(tmp_path / "run"), epochs=3)
    eval_steps = _eval_steps(trial)
    assert [mode_step for _, mode_step in eval_steps] == list(range(3 * runs.EVAL_BATCHES))
    assert declared_eval_pass_steps(trial) == 64
    # TRAIN keeps its schedule: every 10th step
    assert all(trial.mode_step(step) % 10 == 0 for step in trial.steps() if trial.mode(step) == ModeKeys.TRAIN)
    # only the losses at the steps outside the schedule
    for step, mode_step in eval_steps:
        if mode_step % 10:
            assert trial.tensor_names(step=step) == [runs.LOSS]


def test_a_long_pass_saves_only_its_first_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINGUARD_EVAL_PASS_STEPS", "5")
    trial = runs.train(str(tmp_path / "run"), epochs=3, eval_batches=20)
    eval_steps = [mode_step for _, mode_step in _eval_steps(trial)]
    for index in range(3):  # each 20-step pass: its first 5, plus the schedule's every 10th EVAL step
        start = 20 * index
        saved = [step - start for step in eval_steps if start <= step < start + 20]
        assert saved == sorted({0, 1, 2, 3, 4} | {s - start for s in range(start, start + 20) if s % 10 == 0})
    assert declared_eval_pass_steps(trial) == 5


def test_the_pass_bound_unit():
    saves = EvalPassSaves(3)
    included = ["weights", "losses"]
    # pass 1: global steps 10..14 (EVAL 0..4), pass 2 after a TRAIN step: 20..24 (EVAL 5..9)
    first = [bool(saves.due(10 + i, i, included)) for i in range(5)]
    second = [bool(saves.due(20 + i, 5 + i, included)) for i in range(5)]
    assert first == second == [True, True, True, False, False]
    assert saves.due(20, 5, included) == frozenset({"losses"})  # asked again mid-step: the same answer
    assert EvalPassSaves(0).due(10, 0, included) == frozenset()
    assert saves.due(30, 10, ["weights"]) == frozenset()  # losses not included: nothing
    assert EvalPassSaves(3).facts(included) == {"eval_pass_steps": 3} and EvalPassSaves(0).facts(included) == {}


# -- which passes are comparable ---------------------------------------------------------------


def _split(entries, declared=None, final=True):
    splitter = PassSplitter(declared)
    for step, mode, mode_step in entries:
        splitter.add(step, mode, mode_step)
    return splitter.ready(final)


def _epochs(train_steps: int, eval_steps: int, epochs: int, saved_train, saved_eval):
    """(global, mode, mode step) of the saved steps of alternating epochs and passes."""
    entries, step, modes = [], 0, {ModeKeys.TRAIN: 0, ModeKeys.EVAL: 0}
    for _ in range(epochs):
        for mode, count, saved in ((ModeKeys.TRAIN, train_steps, saved_train), (ModeKeys.EVAL, eval_steps, saved_eval)):
            for _ in range(count):
                if saved(modes[mode]):
                    entries.append((step, mode, modes[mode]))
                step += 1
                modes[mode] += 1
    return entries


def test_every_step_saved_gives_whole_passes():
    passes = _split(_epochs(16, 8, 4, lambda m: True, lambda m: True))
    assert [(p.kind, len(p.compared)) for p in passes] == [("whole", 8)] * 4


def test_one_batch_of_each_pass_is_never_compared():
    # the observed schedule: every 10th step of each mode, 8-batch passes, no declaration
    passes = _split(_epochs(16, 8, 8, lambda m: m % 10 == 0, lambda m: m % 10 == 0))
    assert len(passes) == 7 and not any(p.kind for p in passes)  # pass 4 has no saved step at all
    # the first pass starts at EVAL step 0 but it is one batch of eight
    assert passes[0].start_known and passes[0].why_not == "not the whole pass"
    assert passes[1].why_not == "its first saved step is not its first batch"


def test_whole_passes_are_recognised_without_a_saved_train_step_between():
    entries = _epochs(16, 8, 4, lambda m: m == 0, lambda m: True)  # one TRAIN step saved in the whole run
    assert [p.kind for p in _split(entries)] == ["whole"] * 4


def test_declared_prefixes_of_long_passes_are_compared_with_each_other():
    saved_eval = lambda m: m % 40 < 5 or m % 10 == 0  # noqa: E731 - first 5 of each 40-step pass, and every 10th
    passes = _split(_epochs(16, 40, 3, lambda m: m % 10 == 0, saved_eval), declared=5)
    assert [(p.kind, len(p.compared)) for p in passes] == [("first 5", 5)] * 3
    assert [p.mode_steps[: 5] for p in passes] == [list(range(40 * i, 40 * i + 5)) for i in range(3)]
    # undeclared, the same steps are not known to be the first ones of each pass... but the first pass's are
    undeclared = _split(_epochs(16, 40, 3, lambda m: m % 10 == 0, saved_eval))
    assert not any(p.kind for p in undeclared)


def test_passes_of_another_kind_are_not_compared():
    # a whole short pass, then long ones of which the first 5 steps are saved
    entries = _epochs(16, 4, 1, lambda m: True, lambda m: True)
    offset = entries[-1][0] + 1
    entries += [(offset + step, mode, mode_step + (4 if mode == ModeKeys.EVAL else 16))
                for step, mode, mode_step in _epochs(16, 40, 1, lambda m: True, lambda m: m < 5)]  # fmt: skip
    passes = _split(entries, declared=5)
    assert passes[0].kind == "whole" and passes[1].kind == "" and "first 5" in passes[1].why_not


def test_a_live_pass_waits_for_the_step_that_closes_it():
    entries = _epochs(16, 8, 2, lambda m: True, lambda m: True)
    open_run = entries[: 16 + 8 + 16 + 8]  # the second pass has no step after it yet
    splitter = PassSplitter(None)
    for entry in open_run:
        splitter.add(*entry)
    assert len(splitter.ready(final=False)) == 1
    assert [p.kind for p in splitter.ready(final=True)] == ["whole"]


# -- the rules on runs of the real hook ---------------------------------------------------------


@pytest.mark.parametrize("epochs", [5, 8])
def test_healthy_trainer_like_runs_are_silent(tmp_path, epochs):
    trial = runs.train(str(tmp_path / "run"), epochs=epochs)
    means = runs.pass_means(trial)
    assert len(means) == epochs and means[-1] < means[0]
    for rule in RULES:
        results = evaluate_rule(trial, rule)
        assert first_firing(results) is None, rule
        assert not any(result.not_evaluated for result in results), rule  # judged, not skipped
    passes = next(r for r in evaluate_rule(trial, "Overfit") if r.details.get("passes")).details["passes"]
    assert all(item["eval_steps"] == runs.EVAL_BATCHES for item in passes)


def test_one_batch_of_each_pass_is_not_evaluated_never_a_finding(tmp_path, monkeypatch):
    # the schedule alone, as before: one batch of each pass at a different position; its values rise
    # steadily with the position (0, 2, 4, 6) while each pass's mean does not
    monkeypatch.setenv("TRAINGUARD_EVAL_PASS_STEPS", "0")
    trial = runs.train(str(tmp_path / "run"), epochs=5)
    sampled = runs.pass_means(trial)
    assert len(sampled) == 4 and all(np.diff(sampled) > 0)
    for rule in RULES:
        results = evaluate_rule(trial, rule)
        assert first_firing(results) is None, rule
        [result] = [r for r in results if r.not_evaluated]
        assert "not whole validation passes" in result.not_evaluated and "TRAINGUARD_EVAL_PASS_STEPS" in result.not_evaluated


def test_the_overfitting_twin_is_still_found(tmp_path):
    trial = runs.train(str(tmp_path / "run"), epochs=40, overfit=True)
    means = runs.pass_means(trial)
    assert max(means[int(np.argmin(means)) :]) > 1.2 * min(means)  # the validation loss turned up
    fired = next(r for r in evaluate_rule(trial, "Overfit") if r.fired)
    assert fired.certain and "validation loss rose" in fired.message
    assert first_firing(evaluate_rule(trial, "Overtraining")) is not None


def test_synthetic_single_batch_passes_are_not_compared(tmp_path):
    # written without any declaration: an 8-step pass of which only one step was saved each time,
    # at positions 0, 2, 4, 6 (their values rising) while whole passes would be flat
    steps, modes, mode_steps, step = {}, {}, {}, 0
    eval_mode = train_mode = 0
    for epoch in range(5):
        for _ in range(20):
            if train_mode % 10 == 0:
                steps[step], modes[step] = {"loss": 1.0 / (epoch + 1)}, "TRAIN"
            step, train_mode = step + 1, train_mode + 1
        for position in range(8):
            if eval_mode % 10 == 0:
                steps[step], modes[step], mode_steps[step] = {"loss": 0.5 + 0.3 * position}, "EVAL", eval_mode
            step, eval_mode = step + 1, eval_mode + 1
    del mode_steps  # write_run numbers mode steps over saved steps: the run below says so itself
    run = write_run(tmp_path / "run", steps, modes=modes, collections={"losses": ["loss"]})
    # write_run numbers each mode's saved steps 0, 1, 2...: the EVAL passes' global - mode step shows
    # the other-mode steps between, and none of them starts where the EVAL count says
    results = evaluate_rule(run, "Overfit")
    assert first_firing(results) is None and results[-1].not_evaluated
