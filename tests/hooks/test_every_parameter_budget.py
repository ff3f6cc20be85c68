"""The overhead budget's floor (issue 43 item 5): however costly saving is, the first configured
TRAIN saves keep what the default rules need to judge a run (LossNotDecreasing's three windows of
losses, the windowed tensor rules' evaluations of weights and gradients)."""

from __future__ import annotations

from itertools import pairwise

from tests.hooks.test_overhead_budget import FakeTraining
from trainguard.hooks.overhead_budget import DEFAULT_HEAVY_FLOOR, DEFAULT_LIGHT_FLOOR, HEAVY, QUIET, OverheadBudget
from trainguard.rules.builtin.loss_not_decreasing import LossNotDecreasing
from trainguard.rules.builtin.weight_update_ratio import WeightUpdateRatio


def _costly(max_interval: int = 100) -> FakeTraining:
    """Saving far over any budget, light saves included: a ~1 ms step whose every save, even of a
    loss alone, costs more than a step (the graph convolution of issue 43)."""
    training = FakeTraining(0.01, step_seconds=1e-3, save_seconds=3e-3, light_seconds=2e-3)
    training.budget.max_interval = max_interval
    training.budget.max_light_interval = max_interval
    return training


def test_the_floor_is_what_the_default_rules_need_at_their_defaults():
    assert DEFAULT_LIGHT_FLOOR == 3 * LossNotDecreasing.window.default  # a rise: three windows
    assert DEFAULT_HEAVY_FLOOR == WeightUpdateRatio.window.default + 1  # a full window of pairs


def test_costly_saves_keep_the_floor_of_losses_and_tensors_then_thin():
    training = _costly()
    training.run(3000)
    saved = training.saved_steps()
    assert saved[:DEFAULT_LIGHT_FLOOR] == list(range(0, 10 * DEFAULT_LIGHT_FLOOR, 10))
    assert training.heavy_steps()[:DEFAULT_HEAVY_FLOOR] == list(range(0, 10 * DEFAULT_HEAVY_FLOOR, 10))
    # and past the floor the budget still thins, within its caps
    late = training.saved_steps(1000)
    assert training.budget.thinning and len(late) < 2000 // 10 // 2
    assert max(b - a for a, b in pairwise(late)) <= 100
    assert all(kind == HEAVY for step, kind in training.saved.items() if step < 10 * DEFAULT_HEAVY_FLOOR)


class TrainAndEvaluate:
    """A budget driven as the hook drives it on a full-batch loop with a validation pass after
    every training step (the graph convolution of issue 43): global steps alternate TRAIN and
    EVAL, both saved every ``gap`` of their own steps; EVAL saves are never thinned, but they are
    saves the budget measures (their weights and outputs make them heavy)."""

    def __init__(self, budget: OverheadBudget, *, step_seconds: float, save_seconds: float, gap: int = 10) -> None:
        self.now, self.budget, self.gap = 0.0, budget, gap
        self.step_seconds, self.save_seconds = step_seconds, save_seconds
        self.train_saves: dict[int, int] = {}  # TRAIN mode step -> LIGHT or HEAVY

    def run(self, epochs: int) -> None:
        for epoch in range(epochs):
            for offset, kept in ((0, self._train_kept(epoch)), (1, HEAVY if epoch % self.gap == 0 else QUIET)):
                self.budget.mark(2 * epoch + offset, kept)
                self.now += self.step_seconds + (self.save_seconds if kept != QUIET else 0.0)

    def _train_kept(self, epoch: int) -> int:
        kept = self.budget.keep(epoch) if epoch % self.gap == 0 else QUIET
        if kept != QUIET:
            self.train_saves[epoch] = kept
        return kept


def _alternating(**floors: int) -> TrainAndEvaluate:
    budget = OverheadBudget(0.01, max_interval=100, clock=lambda: loop.now, **floors)
    loop = TrainAndEvaluate(budget, step_seconds=1e-3, save_seconds=3e-3)
    return loop


def test_training_with_evaluation_keeps_the_losses_loss_not_decreasing_needs():
    loop = _alternating()
    loop.run(400)
    assert sorted(loop.train_saves)[:DEFAULT_LIGHT_FLOOR] == list(range(0, 10 * DEFAULT_LIGHT_FLOOR, 10))
    heavy = [step for step, kind in sorted(loop.train_saves.items()) if kind == HEAVY]
    assert heavy[:DEFAULT_HEAVY_FLOOR] == list(range(0, 10 * DEFAULT_HEAVY_FLOOR, 10))
    assert loop.budget.thinning and len(loop.train_saves) < 40, "still thinned past the floor"
    # the same loop without the floor: the oracle that the floor is what keeps them
    bare = _alternating(light_floor=0, heavy_floor=0)
    bare.run(400)
    assert len([step for step in bare.train_saves if step < 10 * DEFAULT_LIGHT_FLOOR]) < DEFAULT_LIGHT_FLOOR


def test_a_short_schedule_keeps_every_configured_save():
    training = _costly()
    training.run(200)  # 20 configured saves: fewer than the floor, all kept
    assert training.saved_steps() == list(range(0, 200, 10))
