"""TrialGuard's waits (issue 46): a step not written yet is not waited for until the timeout, the
wait says what it waits for, pruning works without ``wait_for_step``, and a guard closed before
its hook wrote anything does not claim that training captured nothing. Real trainings of
examples/sweeps/toy_training.py, the default rules live beside them."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch")
optuna = pytest.importorskip("optuna")

from tests.integrations._sweeps import EXPECTED_RULES, load_example  # noqa: E402
from trainguard.integrations.live import LiveRuleMonitor  # noqa: E402
from trainguard.integrations.optuna import FINDING_ATTR, TrialGuard  # noqa: E402

BAD = "lr-far-too-high"


class _Trial:
    """The two methods of ``optuna.Trial`` the guard calls."""

    def __init__(self) -> None:
        self.user_attrs: dict = {}

    def should_prune(self) -> bool:
        return False

    def set_user_attr(self, key: str, value: object) -> None:
        self.user_attrs[key] = value


def _last_written(out_dir: str) -> int | None:
    """The newest complete step on disk, read on its own (not through the guard)."""
    from trainguard.errors import TrainguardError
    from trainguard.trial import create_trial

    try:
        return create_trial(out_dir, collection_wait_timeout=0).last_complete_step
    except TrainguardError:
        return None


def _config(name: str) -> dict:
    toy = load_example("toy_training")
    return next(config for config in toy.CONFIGS if config["name"] == name)


def test_a_step_not_written_yet_is_not_waited_for_until_the_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asking for the step just trained (written only when the next one begins): the guard waits
    for the rules up to the last step written, never for the unwritten one, and says so once."""
    toy = load_example("toy_training")
    asked: list[tuple[int, int | None]] = []  # (step asked for, step the rules were waited for)
    original = LiveRuleMonitor.poll

    def recording_poll(self, wait_for_step=None, timeout=10.0):  # noqa: ANN001, ANN202
        if wait_for_step is not None:
            asked[-1] = (asked[-1][0], wait_for_step)
        return original(self, wait_for_step=wait_for_step, timeout=timeout)

    monkeypatch.setattr(LiveRuleMonitor, "poll", recording_poll)
    out_dir = str(tmp_path / "trial")
    written: list[int | None] = []
    with caplog.at_level(logging.WARNING, logger="trainguard.integrations"), TrialGuard(_Trial(), out_dir) as guard:

        def on_epoch(epoch: int, steps: int, last_saved: int, loss: float) -> bool:
            asked.append((steps - 1, None))
            # a timeout no poll may sit out: without the bound each call would last it whole
            pruned = guard.should_prune(wait_for_step=steps - 1, timeout=120.0)
            written.append(guard.monitor.last_written_step())
            return pruned or epoch == 3

        toy.train({"lr": 0.01}, out_dir, on_epoch)
    assert len(asked) == 4 and guard.finding is None
    for (step, waited), last in zip(asked, written, strict=True):
        assert waited is None or waited < step, (step, waited)
        assert waited is None or last is None or waited <= last
    warnings = [record.getMessage() for record in caplog.records if "is not written to" in record.getMessage()]
    assert len(warnings) == 1 and f"step {asked[0][0]} is not written to {out_dir}" in warnings[0]


def test_pruning_works_without_wait_for_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``should_prune()`` alone judges the steps written so far at each report: rules slower than
    training (each step's evaluation made slow here) still prune the bad configuration at the
    first report whose written steps hold the finding, not whenever the rules happen to get there."""
    from trainguard.rules.runner import RuleRunner
    from trainguard.rules.runner_open import RunOpener

    original = RuleRunner._evaluate_step
    original_open = RunOpener.open

    def slow_evaluation(self, step):  # noqa: ANN001, ANN202
        threading.Event().wait(1.0)
        return original(self, step)

    def late_open(self):  # noqa: ANN001, ANN202
        # the runner opens the run seconds after it appeared, as on a loaded machine (CI: reports
        # made meanwhile judged nothing and let the bad trial go on past its finding)
        threading.Event().wait(4.0)
        return original_open(self)

    monkeypatch.setattr(RuleRunner, "_evaluate_step", slow_evaluation)
    monkeypatch.setattr(RunOpener, "open", late_open)
    toy = load_example("toy_training")
    study = optuna.create_study(pruner=optuna.pruners.NopPruner())
    config = _config(BAD)
    study.enqueue_trial({"lr": config["lr"], "init_scale": config["init_scale"]})
    written_before: list[int | None] = []

    def objective(trial: optuna.Trial) -> float:
        config = {"lr": trial.suggest_float("lr", 1e-4, 10.0, log=True),
                  "init_scale": trial.suggest_float("init_scale", 0.1, 1e4, log=True)}  # fmt: skip
        out_dir = str(tmp_path / f"trial-{trial.number}")
        with TrialGuard(trial, out_dir) as guard:

            def on_epoch(epoch: int, steps: int, last_saved: int, loss: float) -> bool:
                trial.set_user_attr("steps", steps)
                written_before.append(_last_written(out_dir))
                return guard.should_prune(timeout=120.0)

            toy.train(config, out_dir, on_epoch)
        if guard.finding is not None:
            raise optuna.TrialPruned(guard.reason)
        return 0.0

    study.optimize(objective, n_trials=1)
    (bad,) = study.trials
    finding = bad.user_attrs.get(FINDING_ATTR)
    assert bad.state == optuna.trial.TrialState.PRUNED and finding is not None, bad.user_attrs
    assert finding["certain"] and finding["rule"] in EXPECTED_RULES[BAD]
    # every report that let the trial go on had not yet written the finding's step
    assert all(step is None or step < finding["step"] for step in written_before[:-1]), (written_before, finding)


def test_a_guard_closed_before_its_hook_wrote_does_not_say_nothing_was_captured(tmp_path: Path) -> None:
    toy = load_example("toy_training")
    out_dir = str(tmp_path / "trial")
    guard = TrialGuard(_Trial(), out_dir).__enter__()
    guard.close()  # the hook comes later
    final = guard.monitor.final
    assert final and {update.status.value for update in final.values()} == {"Stopped"}, final
    assert not any("without capturing anything" in (update.status_details or "") for update in final.values())
    steps = toy.train({"lr": 0.01}, out_dir, lambda *_: False, epochs=2)
    assert steps > 0
    outputs = list((tmp_path / "trial").rglob("rule-output/*.json"))
    assert all("without capturing anything" not in path.read_text() for path in outputs)
