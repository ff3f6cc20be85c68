"""ReplicaDivergence's verdicts on fingerprints made here (numpy rows, as the hook writes them),
read through a small stand-in of the trial: which rank, which first step, which hint, when
certain, late ranks, sharded parameters, and the single-process case."""

from __future__ import annotations

import json
import zlib
from typing import Any

import numpy as np

from trainguard.errors import TensorUnavailableForStep
from trainguard.rules.builtin.replica_divergence import GRADIENTS_TENSOR, PARAMETERS_TENSOR, ReplicaDivergence

NAMES = ["Net_fc.weight", "Net_fc.bias", "Net_head.weight"]


def _row(values: np.ndarray) -> list[float]:
    values = values.astype(np.float32)
    return [zlib.crc32(values.tobytes()), float(values.sum()), float((values * values).sum()), values.size]


class _Store:
    def __init__(self, metas: dict[str, dict[str, Any]]) -> None:
        self.files = {f"collections/000000000/{worker}_collections.json": json.dumps(
            {"collections": {}, "_meta": {"replica_fingerprints": meta}}).encode() for worker, meta in metas.items()}  # fmt: skip

    def list(self, prefix: str) -> list[str]:
        return [key for key in self.files if key.startswith(prefix)]

    def read(self, key: str) -> bytes:
        return self.files[key]


class _Tensor:
    def __init__(self, values: dict[tuple[int, str], np.ndarray]) -> None:
        self._values = values

    def steps(self) -> list[int]:
        return sorted({step for step, _ in self._values})

    def workers(self, step: int) -> list[str]:
        return sorted(worker for at, worker in self._values if at == step)

    def value(self, step: int, worker: str | None = None) -> np.ndarray:
        if (step, worker) not in self._values:
            raise TensorUnavailableForStep(f"{step} {worker}")
        return self._values[(step, worker)]


class _Trial:
    """What the rule reads of a trial: tensors by step and worker, the collections files."""

    def __init__(self, world: int, sharded: tuple[str, ...] = ()) -> None:
        self.tensors: dict[str, dict[tuple[int, str], np.ndarray]] = {PARAMETERS_TENSOR: {}, GRADIENTS_TENSOR: {}}
        self.store = _Store({f"worker_{rank}": {"parameters": NAMES, "sharded": list(sharded), "rank": rank,
                                                "world": world} for rank in range(world)})  # fmt: skip

    def add(self, tensor: str, step: int, rank: int, rows: list[list[float]]) -> None:
        self.tensors[tensor][(step, f"worker_{rank}")] = np.array(rows, dtype=np.float64)

    def has_tensor(self, name: str) -> bool:
        return bool(self.tensors.get(name))

    def tensor(self, name: str) -> _Tensor:
        return _Tensor(self.tensors[name])

    def framework(self) -> str:
        return "pytorch"


def _training(world: int, steps: list[int], fault: Any = None, *, sharded: tuple[str, ...] = ()) -> _Trial:
    """Ranks that agree at every step except where ``fault(step, rank, kind, index, values)``
    returns other values."""
    trial = _Trial(world, sharded)
    for step in steps:
        for rank in range(world):
            for kind in (PARAMETERS_TENSOR, GRADIENTS_TENSOR):
                rows = []
                for index in range(len(NAMES)):
                    seed = step * 10 + index + (1000 if kind == GRADIENTS_TENSOR else 0)
                    values = np.random.default_rng(seed).standard_normal(6)
                    if fault is not None:
                        values = fault(step, rank, kind, index, values)
                    rows.append(_row(values))
                trial.add(kind, step, rank, rows)
    return trial


def _results(trial: _Trial, steps: list[int], **parameters: Any) -> list[Any]:
    rule = ReplicaDivergence(trial, **parameters)
    return [rule.evaluate(step) for step in steps]


def test_healthy_ranks_are_silent_and_a_nudge_is_found_then_certain() -> None:
    steps = [0, 4, 8, 12]
    assert not any(result.fired for result in _results(_training(4, steps), steps))

    def nudge(step: int, rank: int, kind: str, index: int, values: np.ndarray) -> np.ndarray:
        if rank == 2 and step >= 8 and kind == PARAMETERS_TENSOR and index == 0:
            values = values.copy()
            values[0] += 1e-3
        return values

    results = _results(_training(4, steps, nudge), steps)
    assert [result.fired for result in results] == [False, False, True, True]
    assert [result.certain for result in results] == [False, False, False, True]
    assert results[2].details["ranks"] == [2] and results[2].details["first_step"] == 8
    assert results[2].details["tensors"] == ["Net_fc.weight"]
    assert "outside the all-reduced update" in results[2].fix_hint


def test_the_hint_follows_what_disagrees() -> None:
    steps = [0, 4]

    def head_outside(step: int, rank: int, kind: str, index: int, values: np.ndarray) -> np.ndarray:
        return values + rank if index == 2 else values  # one parameter, values and gradients

    def nothing_synced(step: int, rank: int, kind: str, index: int, values: np.ndarray) -> np.ndarray:
        return values + rank

    def seeded_apart(step: int, rank: int, kind: str, index: int, values: np.ndarray) -> np.ndarray:
        return values + rank if kind == PARAMETERS_TENSOR else values

    for fault, words in ((head_outside, "outside the module"), (nothing_synced, "no_sync()"),
                         (seeded_apart, "seeded per rank")):  # fmt: skip
        first = _results(_training(3, steps, fault), steps)[0]
        assert first.fired and words in first.fix_hint, (fault.__name__, first.fix_hint)


def test_a_rank_whose_optimizer_did_not_step() -> None:
    """Rank 1's parameters keep their step-4 values at step 8 while the others moved."""
    steps = [0, 4, 8]

    def frozen(step: int, rank: int, kind: str, index: int, values: np.ndarray) -> np.ndarray:
        if rank == 1 and step == 8 and kind == PARAMETERS_TENSOR:
            return np.random.default_rng(4 * 10 + index).standard_normal(6)  # step 4's values
        return values

    result = _results(_training(3, steps, frozen), steps)[2]
    assert result.fired and result.details["optimizer_did_not_step"] == [1]
    assert "optimizer of rank 1 did not step" in result.fix_hint


def test_a_late_rank_is_compared_when_it_arrives() -> None:
    steps = [0, 4]

    def nudged(step: int, rank: int, kind: str, index: int, values: np.ndarray) -> np.ndarray:
        return values + 1 if rank == 2 and kind == PARAMETERS_TENSOR and step == 4 else values

    trial = _training(3, steps, nudged)
    late = {key: value for key, value in trial.tensors[PARAMETERS_TENSOR].items() if key == (4, "worker_2")}
    del trial.tensors[PARAMETERS_TENSOR][(4, "worker_2")]
    rule = ReplicaDivergence(trial)
    assert not rule.evaluate(4).fired  # ranks 0 and 1 agree; rank 2 not there yet
    trial.tensors[PARAMETERS_TENSOR].update(late)
    result = rule.evaluate(8)  # a later step's evaluation looks back
    assert result.fired and result.details["ranks"] == [2] and result.details["first_step"] == 4


def test_sharded_and_resized_parameters_are_not_judged() -> None:
    steps = [0, 4]

    def shards(step: int, rank: int, kind: str, index: int, values: np.ndarray) -> np.ndarray:
        return values + rank if index == 0 else values

    results = _results(_training(3, steps, shards, sharded=("Net_fc.weight",)), steps)
    assert not any(result.fired for result in results)
    assert results[0].details["unjudged"] == ["Net_fc.weight"]


def test_tolerance_accepts_a_nondeterministic_reduction() -> None:
    steps = [0, 4]

    def rounding(step: int, rank: int, kind: str, index: int, values: np.ndarray) -> np.ndarray:
        values = values.astype(np.float32)
        if rank == 1:
            values = values.copy()
            values[0] = np.nextafter(values[0], np.float32(np.inf))  # one ulp: other bits
        return values

    trial = _training(2, steps, rounding)
    assert all(result.fired for result in _results(trial, steps))
    assert not any(result.fired for result in _results(trial, steps, tolerance=1e-5))


def test_a_single_process_run_is_not_applicable() -> None:
    trial = _Trial(1)
    rule = ReplicaDivergence(trial)
    assert rule.evaluate(0) is None
    result = rule.finish()
    assert result is not None and result.not_applicable and "single-process" in (result.not_evaluated or "")


def test_a_step_is_judged_once_every_rank_wrote_it() -> None:
    """Two of four ranks at a step have no majority: judged then, the odd rank 2 would be
    named together with rank 3; the rule waits for the other two (or the end of training)."""
    steps = [0, 4]

    def nudged(step: int, rank: int, kind: str, index: int, values: np.ndarray) -> np.ndarray:
        return values + 1 if rank == 2 and kind == PARAMETERS_TENSOR and step == 4 else values

    trial = _training(4, steps, nudged)
    held = {key: trial.tensors[PARAMETERS_TENSOR].pop(key) for key in [(4, "worker_0"), (4, "worker_1")]}
    rule = ReplicaDivergence(trial)
    assert not rule.evaluate(4).fired
    trial.tensors[PARAMETERS_TENSOR].update(held)
    result = rule.evaluate(8)
    assert result.fired and result.details["ranks"] == [2]
    # at the end, two ranks that wrote are compared whatever the others did
    trial = _training(4, steps, nudged)
    for key in [(4, "worker_0"), (4, "worker_1")]:
        del trial.tensors[PARAMETERS_TENSOR][key]
    rule = ReplicaDivergence(trial)
    rule.evaluate(4)
    result = rule.finish()
    assert result is not None and result.fired and result.details["ranks"] == [2, 3]


def test_fingerprints_judged_out_of_order_report_the_first_step_and_confirm_on_two_steps() -> None:
    """A slower rank's step-0 files land after step 4 was judged: the finding's first step is 0
    (the smallest seen, not the first judged), and the confirmation names the later fingerprint."""
    steps = [0, 4, 8]

    def seeded_apart(step: int, rank: int, kind: str, index: int, values: np.ndarray) -> np.ndarray:
        return values + rank if kind == PARAMETERS_TENSOR else values

    trial = _training(2, steps, seeded_apart)
    held = {key: trial.tensors[PARAMETERS_TENSOR].pop(key) for key in [(0, "worker_1"), (8, "worker_1")]}
    rule = ReplicaDivergence(trial)
    first = rule.evaluate(4)  # step 4 judged (step 0 lacks rank 1 yet)
    assert first.fired and not first.certain and first.details["first_step"] == 4
    trial.tensors[PARAMETERS_TENSOR][(0, "worker_1")] = held[(0, "worker_1")]
    again = rule.evaluate(4)  # step 0 arrives: a second fingerprint that differs
    assert again.certain and again.details["first_step"] == 0
    assert "fingerprint of step 4" in again.message, again.message


def test_confirmed_by_gradients_the_first_step_is_the_gradients_first() -> None:
    """A parameter outside DDP: its gradients differ from step 0, its values only after updates.
    Confirmed at step 4 by the gradients seen twice, the finding's first step is 0 and the message
    names the later fingerprint, not 'first at step 4 (fingerprint of step 4)'."""
    steps = [0, 4]

    def outside(step: int, rank: int, kind: str, index: int, values: np.ndarray) -> np.ndarray:
        if index == 2 and (kind == GRADIENTS_TENSOR or step >= 4):
            return values + rank
        return values

    results = _results(_training(2, steps, outside), steps)
    assert results[1].fired and results[1].certain, results[1].message
    assert results[1].details["first_step"] == 0, results[1].message
    assert "first at step 0 (fingerprint of step 4" in results[1].message, results[1].message
