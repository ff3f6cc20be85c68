"""The live reader's bookkeeping stays bounded on long runs."""

from __future__ import annotations

from trainguard.format.index import IndexEntry, StepIndex, render_index
from trainguard.format.layout import event_key, index_key
from trainguard.modes import ModeKeys
from trainguard.storage.memory import MemoryStore
from trainguard.trial import state as state_module
from trainguard.trial.state import RunState


def _write_steps(store: MemoryStore, steps: range) -> None:
    for step in steps:
        index = StepIndex(step, "worker_0", ModeKeys.TRAIN, step, event_key(step, "worker_0"), [IndexEntry("loss", 0, 40)])
        store.write(index_key(step, "worker_0"), render_index(index))


def test_listed_index_keys_are_forgotten_behind_the_token(monkeypatch):
    monkeypatch.setattr(state_module, "_SEEN_PRUNE_AT", 100)
    store = MemoryStore("prune")
    state = RunState(store, num_workers=1)
    total = 0
    for start in range(0, 1000, 250):  # a live run: steps arrive in batches between refreshes
        _write_steps(store, range(start, start + 250))
        total += state.refresh()
    assert total == 1000 and sorted(state.steps) == list(range(1000))
    assert len(state._seen) <= 250, "keys behind the listing token must be pruned"
    # nothing is read twice after pruning, and new steps still arrive
    assert state.refresh() == 0
    _write_steps(store, range(1000, 1010))
    assert state.refresh() == 10 and max(state.steps) == 1009


def test_global_mode_steps_are_addressed_by_global_step():
    """A GLOBAL-mode step whose mode_step differs from its step must not shadow another step."""
    store = MemoryStore("global")
    for step, mode_step in [(4, 0), (16, 4), (20, 5)]:
        index = StepIndex(step, "worker_0", ModeKeys.GLOBAL, mode_step, event_key(step, "worker_0"), [IndexEntry("t", 0, 40)])
        store.write(index_key(step, "worker_0"), render_index(index))
    state = RunState(store, num_workers=1)
    state.refresh()
    assert state.by_mode[ModeKeys.GLOBAL] == {4: 4, 16: 16, 20: 20}
