"""The per-rank fingerprint (hooks/torch_fingerprint.py) and the rank comparison (rules/builtin/
_replicas.py), against numpy oracles, in-process: equal bits give equal rows, any change of one
element changes the hash, and the comparison names the odd rank only where a majority exists."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from trainguard.hooks.torch_fingerprint import NO_GRADIENT, PARAMETERS_TENSOR, fingerprint_rows
from trainguard.rules.builtin._replicas import compare_ranks


def _oracle(array: np.ndarray) -> float:
    """The hash as the module doc defines it, in numpy: the wrapping 64-bit sum of the raw bytes
    (as int64 words where they divide, else int32), times the odd constant, top 52 bits."""
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    words = raw.view(np.int64) if raw.size % 8 == 0 else raw.view(np.int32).astype(np.int64)
    total = int(words.sum(dtype=np.int64)) % 2**64
    return float(((total * 0x9E3779B97F4A7C15) % 2**64) >> 12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.float16])
@pytest.mark.parametrize("shape", [(64, 33), (5, 3), (8, 6)])  # rows of whole 8-byte words or not
def test_equal_bits_equal_rows_one_ulp_changes_the_hash(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    a = torch.randn(*shape).to(dtype)
    b = a.clone()
    rows = fingerprint_rows([a, b, a.t()])  # a transposed (non-contiguous) view: read in its own order
    assert np.array_equal(rows[0], rows[1]) and np.isfinite(rows).all()
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64,
            torch.float16: torch.int16}[dtype]  # fmt: skip
    if a.numel() * a.element_size() % 4 == 0:
        assert rows[0, 0] == _oracle(a.view(bits).numpy())
        assert rows[2, 0] == _oracle(a.t().contiguous().view(bits).numpy())
    assert rows.shape == (3, 3) and rows[0, 2] == a.numel()
    assert np.isclose(rows[0, 1], (a.double() ** 2).sum().item(), rtol=1e-2)
    for row, column in ((0, 0), (shape[0] - 1, shape[1] - 1), (2, 1)):
        changed = b.clone()
        changed.view(bits)[row, column] += 1  # one ulp of one element, anywhere
        assert fingerprint_rows([changed])[0, 0] != rows[0, 0]


def test_a_channels_last_weight_is_read_in_its_logical_order() -> None:
    weight = torch.randn(4, 6, 3, 2)
    rows = fingerprint_rows([weight, weight.to(memory_format=torch.channels_last)])
    assert rows[0, 0] == rows[1, 0] == _oracle(weight.numpy())


def test_gradients_and_parameters_read_back_together_give_their_own_rows() -> None:
    from trainguard.hooks.torch_fingerprint import PendingRows, read_rows

    parameters = [torch.randn(8, 6), torch.randn(7), torch.randn(3, 5)]
    gradients = [torch.randn(8, 6), None, torch.randn(3, 5).bfloat16()]
    together = read_rows(PendingRows(parameters), PendingRows(gradients), PendingRows([]))
    assert np.array_equal(together[0], fingerprint_rows(parameters))
    assert np.array_equal(together[1], fingerprint_rows(gradients))
    assert together[1][1, 0] == NO_GRADIENT and together[2].shape == (0, 3)
    assert [row[0] for row in together[0]] == [_oracle(tensor.numpy()) for tensor in parameters]


def test_parameter_words_made_once_follow_in_place_updates_and_a_moved_storage() -> None:
    """The hook keeps each parameter's integer view between due steps (an optimizer updates in
    place); the rows stay the oracle's after an in-place update, and after ``.data`` is replaced
    (another storage) the view is made again rather than reading the old one."""
    from trainguard.hooks.torch_fingerprint import ReplicaFingerprints

    class _Hook:  # what ReplicaFingerprints reads of a hook, nothing else
        saving_this_step = True
        _due = {"replica_fingerprints"}
        _collections_dirty = False
        written: dict = {}

        def _rank_and_world(self) -> tuple[int, int]:
            return 0, 1

        def write_tensor(self, name: str, value: np.ndarray, nbytes: int) -> None:
            self.written[name] = value

    hook = _Hook()
    fingerprints = ReplicaFingerprints(hook, always=True)
    model = nn.Linear(6, 5)  # a (5, 6) weight: rows of 3 words of 8 bytes; a bias of 5 floats
    fingerprints.add_model("m", model)
    for change in ("none", "in place", "data replaced", "in place again"):
        with torch.no_grad():
            if change.startswith("in place"):
                model.weight.add_(0.25)
                model.bias.mul_(-3.0)
            elif change == "data replaced":
                model.weight.data = torch.randn(5, 6)
                model.bias.data = torch.randn(5)
        fingerprints.step_began()
        fingerprints.step_ended()
        rows = hook.written[PARAMETERS_TENSOR]
        assert [row[0] for row in rows] == [_oracle(model.weight.detach().numpy()),
                                            _oracle(model.bias.detach().numpy())], change  # fmt: skip


def test_a_missing_gradient_has_its_own_row() -> None:
    rows = fingerprint_rows([None, torch.zeros(3)])
    assert rows[0].tolist() == [NO_GRADIENT, 0.0, 0.0]  # finite: no NaN for readers that scan every tensor
    assert rows[1, 0] != NO_GRADIENT and rows[1, 2] == 3


def _row(seed: int, size: int = 10) -> np.ndarray:
    values = np.random.default_rng(seed).standard_normal(size).astype(np.float32)
    return np.array([zlib.crc32(values.tobytes()), values.sum(), (values * values).sum(), size])


def test_the_odd_rank_is_named_only_with_a_majority() -> None:
    names = ["w", "b", "shard"]
    same, odd = _row(0), _row(1)
    four = {f"worker_{rank}": (names, np.stack([odd if rank == 2 else same, same, _row(10 + rank, 5 + rank)]))
            for rank in range(4)}  # fmt: skip
    found, unjudged = compare_ranks(four, sharded=set(), tolerance=0.0)
    assert [(item.name, item.odd_ranks, item.reference_rank) for item in found] == [("w", (2,), 0)]
    assert unjudged == {"shard"}  # another size on every rank: a shard, not judged
    two = {worker: rows for worker, rows in four.items() if worker in ("worker_0", "worker_2")}
    found, _ = compare_ranks(two, sharded=set(), tolerance=0.0)
    assert [(item.odd_ranks, item.reference_rank) for item in found] == [((0, 2), -1)]  # who is off: unknown
    found, unjudged = compare_ranks(four, sharded={"w"}, tolerance=0.0)
    assert found == [] and unjudged == {"w", "shard"}


def test_tolerance_compares_the_sums_relatively() -> None:
    a = _row(0)
    near = a.copy()
    near[0] += 1  # other bits
    near[1] *= 1 + 1e-7
    far = a.copy()
    far[0] += 2
    far[2] *= 1 + 1e-3
    ranks = {"worker_0": (["w"], a[None]), "worker_1": (["w"], near[None]), "worker_2": (["w"], far[None])}
    assert [item.odd_ranks for item in compare_ranks(ranks, sharded=set(), tolerance=1e-5)[0]] == [(2,)]
    assert [item.odd_ranks for item in compare_ranks(ranks, sharded=set(), tolerance=0.0)[0]] == [(0, 1, 2)]


def _train_single(run: Path, *, always: bool) -> None:
    from trainguard.config.save_config import SaveConfig
    from trainguard.hooks.torch_fingerprint import ReplicaFingerprints
    from trainguard.pytorch import Hook

    hook = Hook(out_dir=str(run), include_collections=["weights", "replica_fingerprints"],
                save_config=SaveConfig(save_interval=1))  # fmt: skip
    if always:
        hook._fingerprints = ReplicaFingerprints(hook, always=True)  # as bench/ddp_fingerprint.py does
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    hook.register_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        optimizer.zero_grad()
        model(torch.randn(3, 4)).pow(2).mean().backward()
        optimizer.step()
    hook.close()


def test_a_single_process_writes_no_fingerprint_unless_asked(tmp_path: Path) -> None:
    """Nothing to compare with: the collection is included but writes nothing; forced (the
    benchmark), the rows follow the names of the collections file, after each step's update."""
    from trainguard.config.collections import CollectionManager
    from trainguard.hooks.torch_fingerprint import GRADIENTS_TENSOR, META_KEY
    from trainguard.trials import create_trial

    _train_single(tmp_path / "plain", always=False)
    trial = create_trial(str(tmp_path / "plain"))
    assert trial.tensor_names(collection="weights") and not trial.has_tensor(PARAMETERS_TENSOR)
    _train_single(tmp_path / "forced", always=True)
    trial = create_trial(str(tmp_path / "forced"))
    steps = trial.tensor(PARAMETERS_TENSOR).steps()
    assert steps == trial.tensor("Sequential_0.weight").steps()
    meta = CollectionManager.meta_of((tmp_path / "forced/collections/000000000/worker_0_collections.json").read_bytes())
    names = meta[META_KEY]["parameters"]
    assert names == ["Sequential_0.weight", "Sequential_0.bias", "Sequential_2.weight", "Sequential_2.bias"]
    assert trial.tensor_names(collection="weights") == ["Sequential_0.weight", "Sequential_2.weight"]  # not ours
    rows = trial.tensor(PARAMETERS_TENSOR).value(steps[0])
    weight_next = trial.tensor("Sequential_0.weight").value(steps[1])  # saved as the next step began
    assert rows[0, 0] == _oracle(np.ascontiguousarray(weight_next, dtype=np.float32))
    assert trial.tensor(GRADIENTS_TENSOR).value(steps[0]).shape == (4, 3)


def test_an_error_disables_the_fingerprint_not_the_capture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainguard.hooks import torch_fingerprint
    from trainguard.trials import create_trial

    def broken(*pending: object) -> list[np.ndarray]:
        raise RuntimeError("a fingerprint that fails")

    monkeypatch.setattr(torch_fingerprint, "read_rows", broken)
    _train_single(tmp_path / "run", always=True)  # trains all its steps
    trial = create_trial(str(tmp_path / "run"))
    assert len(trial.tensor("Sequential_0.weight").steps()) == 5
    assert not trial.has_tensor(PARAMETERS_TENSOR)
