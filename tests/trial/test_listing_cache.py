"""The trial's cached listings (steps, modes, a tensor's steps, names per mode or step) give the
same answers as recomputing them from the run's index, on a live 2-worker run as it grows; and a
worker's view of the trial reads that worker's values."""

from __future__ import annotations

import numpy as np

from trainguard.config.collections import CollectionManager
from trainguard.format.layout import END_OF_TRAINING, collections_key
from trainguard.modes import ModeKeys
from trainguard.storage import LocalStore
from trainguard.trial import StepState, Trial
from trainguard.trial.worker_view import WorkerTrial
from trainguard.writer.thread import StepWriter

NAMES = ("Net_fc.weight", "CrossEntropyLoss_output_0")


def _schedule() -> list[tuple[int, ModeKeys, int]]:
    """TRAIN steps with an EVAL step every 4th, mode steps counted per mode."""
    counts: dict[ModeKeys, int] = {}
    steps = []
    for step in range(0, 24, 2):
        mode = ModeKeys.EVAL if step % 8 == 6 else ModeKeys.TRAIN
        counts[mode] = counts.get(mode, -1) + 1
        steps.append((step, mode, counts[mode]))
    return steps


def _oracle_steps(trial: Trial, mode: ModeKeys, incomplete: bool) -> list[int]:
    state = trial._state
    return sorted(ms for ms, step in state.by_mode[mode].items() if incomplete or state.is_complete(step))


def _oracle_tensor_steps(trial: Trial, name: str, mode: ModeKeys) -> list[int]:
    state = trial._state
    found = []
    for step in state.tensors.get(name, {}):
        if not state.is_complete(step):
            continue
        record = state.steps[step]
        if mode == ModeKeys.GLOBAL:
            found.append(step)
        elif record.mode == mode:
            found.append(record.mode_step)
    return sorted(found)


def _check(trial: Trial) -> None:
    trial.refresh(force=True)
    state = trial._state
    for mode in (ModeKeys.GLOBAL, ModeKeys.TRAIN, ModeKeys.EVAL):
        for incomplete in (False, True):
            assert trial.steps(mode, show_incomplete_steps=incomplete) == _oracle_steps(trial, mode, incomplete)
        for name in NAMES:
            assert trial.tensor(name).steps(mode) == _oracle_tensor_steps(trial, name, mode)
        if mode != ModeKeys.GLOBAL:
            wanted = set(state.by_mode[mode].values())
            expected = sorted(n for n in state.tensors if wanted.intersection(state.tensors[n]))
            assert trial.tensor_names(mode=mode) == expected
        for mode_step in range(0, 14):
            step = state.by_mode[mode].get(mode_step)
            later = [s for s in state.by_mode[mode] if s > mode_step]
            last = state.last_complete_step()
            if step is not None and state.is_complete(step):
                expected_state = StepState.AVAILABLE
            elif state.training_ended or (later and last is not None and state.by_mode[mode][min(later)] <= last):
                expected_state = StepState.UNAVAILABLE
            else:
                expected_state = StepState.NOT_YET_AVAILABLE
            assert trial.has_passed_step(mode_step, mode) == expected_state, (mode, mode_step)
    expected_modes = sorted({record.mode for record in state.steps.values()}, key=lambda mode: mode.value)
    assert trial.modes() == expected_modes
    for step in state.steps:
        assert trial.tensor_names(step=step) == sorted(n for n in state.tensors if step in state.tensors[n])


def test_cached_listings_match_the_index_as_a_live_run_grows(tmp_path) -> None:
    store = LocalStore(tmp_path)
    for worker in ("worker_0", "worker_1"):
        writer = StepWriter(store, worker)
        writer.write_object(collections_key(worker), CollectionManager.pytorch_defaults().render(2))
        assert writer.close()
    trial = None
    incomplete_seen = 0
    for step, mode, mode_step in _schedule():
        # worker_0 first: the step is incomplete until worker_1 wrote it too
        for worker in ("worker_0", "worker_1"):
            writer = StepWriter(store, worker)  # closed at once: the step is on disk when checked
            writer.begin_step(step, mode, mode_step)
            rank = float(worker[-1])
            for name in NAMES if step % 4 == 0 else NAMES[:1]:
                value = np.full(3, step + rank / 10, dtype=np.float32)
                writer.add_tensor(name, value, nbytes=value.nbytes)
            writer.end_step()
            assert writer.close()
            trial = trial or Trial(store, collection_wait_timeout=5)
            _check(trial)
            incomplete_seen += trial.steps(show_incomplete_steps=True) != trial.steps()
    assert incomplete_seen == len(_schedule()), "every step was checked while only worker_0 had written it"
    store.write(END_OF_TRAINING, b"")
    _check(trial)
    assert trial.steps() == [step for step, _, _ in _schedule()]
    # a worker's view reads that worker's values; the run's facts stay the run's
    for worker, rank in (("worker_0", 0.0), ("worker_1", 0.1)):
        view = WorkerTrial(trial, worker)
        assert view.steps() == trial.steps() and view.workers() == ["worker_0", "worker_1"]
        np.testing.assert_allclose(view.tensor("Net_fc.weight").value(4), np.full(3, 4 + rank, np.float32))
        np.testing.assert_allclose(view.tensor_values(["Net_fc.weight"], 8)["Net_fc.weight"], 8 + rank)
        assert view.tensor("Net_fc.weight").reduction_value(4, "max") == np.float32(4 + rank)
