"""The overhead budget: the configured schedule through the warm-up, then fewer saves while saving
costs more than its share of training time; light collections thinned only after heavy ones;
every save on the configured grid; nothing thinned without a budget or with an explicit interval."""

from __future__ import annotations

import os
import subprocess
import sys
from itertools import pairwise

import pytest
import torch
import torch.nn as nn

import trainguard.pytorch as tg
from trainguard.errors import ConfigError
from trainguard.hooks.overhead_budget import HEAVY, LIGHT, QUIET, OverheadBudget
from trainguard.trials import create_trial
from trainguard.zero_code import DEFAULT_OVERHEAD_BUDGET, capture_config


class FakeTraining:
    """Drives a budget as a hook would: ``step_seconds`` of training per step, ``save_seconds``
    more on each heavy save and ``light_seconds`` on each light one; a save every ``gap`` steps;
    the writer uses ``writer_seconds`` of CPU per heavy save."""

    def __init__(
        self,
        budget_fraction: float,
        *,
        step_seconds: float = 1e-3,
        save_seconds: float = 0.0,
        light_seconds: float = 0.0,
        writer_seconds: float = 0.0,
        gap: int = 10,
    ) -> None:
        self.now = 0.0
        self.writer_cpu = 0.0
        self.budget = OverheadBudget(budget_fraction, clock=lambda: self.now)
        self.step_seconds, self.save_seconds, self.light_seconds = step_seconds, save_seconds, light_seconds
        self.writer_seconds, self.gap = writer_seconds, gap
        self.saved: dict[int, int] = {}  # step -> HEAVY or LIGHT

    def run(self, steps: int, start: int = 0) -> None:
        for step in range(start, start + steps):
            kept = self.budget.keep(step) if step % self.gap == 0 else QUIET
            if kept == QUIET:
                if (step + 1) % self.gap in (0, 1, 2):  # the marks a hook makes: before, at, after a configured step
                    self.budget.mark(step, QUIET)
            else:
                self.budget.mark(step, kept, lambda: self.writer_cpu)
                self.saved[step] = kept
            self.now += self.step_seconds
            if kept == HEAVY:
                self.now += self.save_seconds
                self.writer_cpu += self.writer_seconds
            elif kept == LIGHT:
                self.now += self.light_seconds

    def heavy_steps(self, low: int = 0, high: int | None = None) -> list[int]:
        return [s for s, k in sorted(self.saved.items()) if k == HEAVY and low <= s < (high or 10**12)]

    def saved_steps(self, low: int = 0, high: int | None = None) -> list[int]:
        return [s for s in sorted(self.saved) if low <= s < (high or 10**12)]


def _share(training: FakeTraining, low: int, high: int) -> float:
    """The capture's cost over steps [low, high) as a share of the training time (the oracle)."""
    heavy = len(training.heavy_steps(low, high))
    light = len(training.saved_steps(low, high)) - heavy
    cost = heavy * (training.save_seconds + training.writer_seconds) + light * training.light_seconds
    return cost / ((high - low) * training.step_seconds)


def test_cheap_saves_keep_the_configured_schedule():
    training = FakeTraining(0.02, save_seconds=1e-4)  # 1 % of training time at every 10th step
    training.run(5000)
    assert training.heavy_steps() == list(range(0, 5000, 10))
    assert not training.budget.thinning


def test_costly_heavy_saves_are_thinned_to_the_budget_after_the_warmup():
    training = FakeTraining(0.02, save_seconds=2e-3, writer_seconds=2e-3)  # 40 % at every 10th step
    training.run(20000)
    heavy = training.heavy_steps()
    # the first 10 saves pay one-off costs and are not measured; 20 x the budget is seen in the
    # next EARLY_SAVES: decided there, not after the warm-up's 20 saves
    assert heavy[:16] == list(range(0, 160, 10)), "the warm-up keeps the configured schedule"
    assert heavy[16] > 160
    assert all(step % 10 == 0 for step in training.saved_steps())
    assert training.saved_steps(200) == list(range(200, 20000, 10)), "losses keep every configured step"
    late = training.heavy_steps(10000)
    assert 10 < len(late) < 100
    gaps = {b - a for a, b in pairwise(late)}
    assert len(gaps) == 1 and gaps.pop() <= 500, "a regular subset, at most 500 steps apart"
    assert _share(training, 10000, 20000) <= 0.02 * 1.3


def test_saves_a_little_over_budget_keep_the_whole_warmup():
    training = FakeTraining(0.02, save_seconds=3e-4, writer_seconds=1e-4)  # 4 %: 2 x the budget
    training.run(20000)
    heavy = training.heavy_steps()
    assert heavy[:20] == list(range(0, 200, 10)), "not far enough over budget to cut the warm-up short"
    assert training.budget.thinning and max(b - a for a, b in pairwise(heavy[:40])) > 10
    assert _share(training, 10000, 20000) <= 0.02 * 1.3


def test_heavy_saves_never_sparser_than_the_max_interval():
    training = FakeTraining(0.02, save_seconds=0.2)  # a save costs 200 steps
    training.run(20000)
    late = training.heavy_steps(5000)
    assert late and max(b - a for a, b in pairwise(late)) <= 500
    assert training.saved_steps(5000) == list(range(5000, 20000, 10))


def test_light_saves_are_thinned_only_when_they_alone_are_over_budget():
    training = FakeTraining(0.02, save_seconds=2e-3, light_seconds=5e-4)  # light alone: 5 %
    training.run(40000)
    saved = training.saved_steps(20000)
    gaps = [b - a for a, b in pairwise(saved)]
    assert min(gaps) > 10 and max(gaps) <= 100
    assert _share(training, 20000, 40000) <= 0.02 * 1.3
    heavy = training.heavy_steps(20000)
    assert heavy and max(b - a for a, b in pairwise(heavy)) <= 500


def test_thinning_is_undone_when_saving_gets_cheap():
    training = FakeTraining(0.02, save_seconds=4e-3)
    training.run(10000)
    assert training.budget.thinning
    training.save_seconds = 0.0
    training.run(30000, start=10000)
    assert not training.budget.thinning
    assert training.heavy_steps(39000) == list(range(39000, 40000, 10))


def test_a_budget_outside_zero_and_one_is_refused():
    with pytest.raises(ValueError):
        OverheadBudget(0.0)
    with pytest.raises(ValueError):
        OverheadBudget(1.5)


def test_the_hook_refuses_a_bad_budget(run_dir):
    with pytest.raises(ConfigError, match="overhead_budget"):
        tg.Hook(out_dir=run_dir, overhead_budget="lots")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="overhead_budget"):
        tg.Hook(out_dir=run_dir, overhead_budget=2.0)


def test_zero_code_reads_the_budget_from_the_environment(tmp_path):
    config = capture_config({"TRAINGUARD_OUT_DIR": str(tmp_path), "TRAINGUARD_OVERHEAD_BUDGET": "0.05"})
    assert config.overhead_budget == 0.05
    config = capture_config({"TRAINGUARD_OUT_DIR": str(tmp_path), "TRAINGUARD_OVERHEAD_BUDGET": "0"})
    assert config.overhead_budget is None
    with pytest.raises(ConfigError, match="TRAINGUARD_OVERHEAD_BUDGET"):
        capture_config({"TRAINGUARD_OUT_DIR": str(tmp_path), "TRAINGUARD_OVERHEAD_BUDGET": "-1"})


def _train_mlp(hook: tg.Hook, steps: int, *, register: bool = True) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    criterion = nn.CrossEntropyLoss()
    if register:
        hook.register_module(model)
        hook.register_loss(criterion)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, labels = torch.randn(16, 32), torch.randint(0, 4, (16,))
    for _ in range(steps):
        optimizer.zero_grad()
        loss = criterion(model(inputs), labels)
        loss.backward()
        optimizer.step()


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_real_run_is_thinned_on_the_configured_grid_and_reads_back(run_dir, writer):
    # A budget no capture can meet (0.01 % of a sub-millisecond step): thinning must happen.
    hook = tg.Hook(
        out_dir=run_dir,
        save_config=tg.SaveConfig(save_interval=5),
        overhead_budget=1e-4,
        include_collections=["weights", "gradients", "losses"],
        writer=writer,
    )
    _train_mlp(hook, 3000)
    hook.close()
    trial = create_trial(run_dir)
    weights = trial.tensor(trial.tensor_names(collection="weights")[0]).steps()
    scalars = trial.tensor(trial.tensor_names(collection="losses")[0]).steps()
    # unmeasured saves, then the measured ones of a first window: far over budget, it ends early
    assert weights[:16] == list(range(0, 80, 5)), "the warm-up keeps the configured schedule"
    assert weights[16] > 80, "saving far over budget is thinned before the warm-up's 20 saves"
    assert all(step % 5 == 0 for step in trial.steps())
    late = [step for step in weights if step >= 1500]
    assert late and len(late) < 1500 // 5 // 4 and max(b - a for a, b in pairwise(late)) <= 500
    assert set(weights) <= set(scalars), "heavy saves are a subset of the light ones"
    late_scalars = [step for step in scalars if step >= 1500]
    assert max(b - a for a, b in pairwise(late_scalars)) <= 100
    gradients = trial.tensor_names(collection="gradients")
    assert gradients and all(trial.tensor(name).steps() == weights for name in gradients)


def test_a_max_interval_keeps_heavy_saves_closer(run_dir):
    # What trainguard run --rules asks for: however costly, weights at most 50 steps apart here.
    hook = tg.Hook(
        out_dir=run_dir,
        save_config=tg.SaveConfig(save_interval=5),
        overhead_budget=1e-4,
        overhead_max_interval=50,
        include_collections=["weights", "losses"],
    )
    assert hook._budget is not None and hook._budget.max_interval == 50
    _train_mlp(hook, 2000)
    hook.close()
    trial = create_trial(run_dir)
    weights = trial.tensor(trial.tensor_names(collection="weights")[0]).steps()
    late = [step for step in weights if step >= 1000]
    assert len(late) < 1000 // 5 // 2, "still thinned"
    assert max(b - a for a, b in pairwise(late)) <= 50


def test_the_hook_refuses_a_bad_max_interval(run_dir, tmp_path):
    for bad in (0, -5, 2.5, "100"):
        with pytest.raises(ConfigError, match="overhead_max_interval"):
            tg.Hook(out_dir=run_dir, overhead_budget=0.02, overhead_max_interval=bad)  # type: ignore[arg-type]
    environ = {"TRAINGUARD_OUT_DIR": str(tmp_path), "TRAINGUARD_OVERHEAD_BUDGET": "0.02"}
    assert capture_config({**environ, "TRAINGUARD_OVERHEAD_MAX_INTERVAL": "100"}).overhead_max_interval == 100
    for bad in ("often", "0"):
        with pytest.raises(ConfigError, match="TRAINGUARD_OVERHEAD_MAX_INTERVAL"):
            capture_config({**environ, "TRAINGUARD_OVERHEAD_MAX_INTERVAL": bad})


def test_without_a_budget_every_configured_step_is_saved(run_dir):
    hook = tg.Hook(
        out_dir=run_dir, save_config=tg.SaveConfig(save_interval=5), include_collections=["weights", "losses"]
    )
    _train_mlp(hook, 600)
    hook.close()
    trial = create_trial(run_dir)
    assert trial.steps() == list(range(0, 600, 5))
    assert trial.tensor(trial.tensor_names(collection="weights")[0]).steps() == list(range(0, 600, 5))


def test_trainguard_run_thins_with_a_budget_and_not_with_an_explicit_interval(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch, torch.nn as nn\n"
        "torch.manual_seed(0)\n"
        "model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "x, y = torch.randn(8, 256), torch.randint(0, 10, (8,))\n"
        "for _ in range(1500):\n"
        "    optimizer.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); optimizer.step()\n"
    )
    counts = {}
    for name, extra in (("default", ["--overhead-budget", "0.0001"]), ("fixed", ["--save-interval", "10"])):
        out = tmp_path / name
        subprocess.run(
            [
                sys.executable,
                "-m",
                "trainguard.cli",
                "run",
                "--out",
                str(out),
                *extra,
                "--",
                sys.executable,
                str(script),
            ],
            check=True,
            capture_output=True,
            env={**os.environ},
        )
        trial = create_trial(str(out))
        weights = trial.tensor_names(collection="weights")
        counts[name] = (len(trial.tensor(weights[0]).steps()), len(trial.steps()))
    assert counts["fixed"] == (150, 150)
    assert counts["default"][0] < 60 and counts["default"][1] >= 20


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], DEFAULT_OVERHEAD_BUDGET),
        (["--save-interval", "10"], None),
        (["--config", "hook.json"], None),
        (["--rules"], DEFAULT_OVERHEAD_BUDGET),
        (["--stop-on-issue"], DEFAULT_OVERHEAD_BUDGET),
        (["--rules", "--overhead-budget", "0"], None),
        (["--rules", "--save-interval", "10"], None),
        (["--overhead-budget", "0.05"], 0.05),
        (["--save-interval", "10", "--overhead-budget", "0.05"], 0.05),
    ],
)
def test_trainguard_run_budgets_1_percent_unless_the_schedule_is_fixed(flags, expected, tmp_path, monkeypatch):
    from trainguard.launch.options import LIVE_RULES_MAX_INTERVAL

    monkeypatch.chdir(tmp_path)
    (tmp_path / "hook.json").write_text('{"HookParameters": {"save_interval": "5"}}')
    config = _run_capture(flags)
    assert config.overhead_budget == expected
    # rules judging the run live keep weights and gradients at most 100 steps apart
    live = "--rules" in flags or "--stop-on-issue" in flags
    assert config.overhead_max_interval == (LIVE_RULES_MAX_INTERVAL if live else None)


def _run_capture(flags: list[str]):  # noqa: ANN202
    """The capture config `trainguard run <flags>` hands its training command, read back as it does."""
    from trainguard.cli import build_parser
    from trainguard.launch.options import child_environment, configure_capture, rule_specs

    args = build_parser().parse_args(["run", *flags, "--", "python", "train.py"])
    environment = child_environment(args, "/tmp/out")
    configure_capture(args, rule_specs(args), environment, "/tmp/out")
    return capture_config(environment, drop_unknown_collections=False)


def test_trainguard_run_refuses_a_budget_of_one_or_more():
    with pytest.raises(ConfigError, match="--overhead-budget"):
        _run_capture(["--overhead-budget", "1.5"])


@pytest.mark.parametrize("zero_code", [False, True], ids=["api", "zero_code"])
def test_configured_steps_the_budget_thins_take_the_quiet_path(run_dir, monkeypatch, zero_code):
    """Once the budget thins, a configured step it keeps nothing of costs what any unsaved step
    costs: the budget is asked ahead, and the hook's general path runs only around kept saves."""
    from trainguard.hooks.zero_code import ZeroCodeHook

    hook_class = ZeroCodeHook if zero_code else tg.Hook
    hook = hook_class(out_dir=str(run_dir), save_config=tg.SaveConfig(save_interval=2),
                      overhead_budget=0.5, include_collections=["weights", "losses"])  # fmt: skip
    budget = hook._budget
    assert budget is not None
    budget.warmup_saves = 10**6  # no decision: the strides below stay
    budget.light_floor = budget.heavy_floor = 0  # ...from the first save on
    budget.light_stride, budget.heavy_stride = 5, 2
    general: list[int] = []
    general_path = hook._driver._general_root_pre_forward
    monkeypatch.setattr(hook._driver, "_general_root_pre_forward", lambda *a: (general.append(hook.step + 1), general_path(*a)))
    _train_mlp(hook, 400, register=not zero_code)
    hook.close()
    trial = create_trial(run_dir)
    # candidates every 2 steps; every 5th kept (light), every 2nd of those heavy
    assert trial.steps() == list(range(0, 400, 10))
    weights = trial.tensor(trial.tensor_names(collection="weights")[0]).steps()
    assert weights == list(range(0, 400, 20))
    later = [step for step in general if step >= 20]
    # the kept save, the step after it (which ends it) and nothing between
    assert set(later) <= {step for kept in range(20, 400, 10) for step in (kept, kept + 1)}, later
    assert len(later) <= 2 * len(range(20, 400, 10))


def test_a_configured_step_asked_ahead_gets_the_same_answer_again():
    """Steps asked ahead and thinned, asked again after a run of quiet steps was cut short (a
    mode change), stay thinned and do not shift which later steps are kept."""
    budget = OverheadBudget(0.5, light_floor=0, heavy_floor=0)  # the stride from the first save on
    budget.light_stride = 3
    assert [budget.keep(step) for step in (0, 2, 4, 6)] == [HEAVY, QUIET, QUIET, HEAVY]
    assert budget.keep(2) == QUIET and budget.keep(4) == QUIET and budget.keep(6) == HEAVY
    assert [budget.keep(step) for step in (8, 10, 12)] == [QUIET, QUIET, HEAVY]
