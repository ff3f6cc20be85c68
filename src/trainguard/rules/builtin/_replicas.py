"""Comparing the ranks' fingerprints of one step (hooks/torch_fingerprint.py writes them).

Pure functions over ``{worker: (names, rows)}``: which tensors disagree, which ranks hold the
odd values, and which tensors cannot be judged (sharded by design, or of a different size on
some rank, which only a shard can be).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Disagreement", "as_rows", "compare_ranks", "rank_of"]

HASH, SUM, SQUARES, ELEMENTS = range(4)  # the columns of rows as compared here (``as_rows``)
NO_TENSOR = -1.0  # the hash of a parameter without a gradient


def as_rows(written: np.ndarray) -> np.ndarray | None:
    """A fingerprint as written, in the columns compared here: the hook's ``[hash, sum of
    squares, elements]`` get a NaN sum (not computed); files of earlier versions hold
    ``[hash, sum, sum of squares, elements]`` already. None for any other shape."""
    if written.ndim != 2:
        return None
    if written.shape[1] == 3:
        rows = np.insert(written.astype(np.float64), SUM, np.nan, axis=1)
        rows[rows[:, HASH] == NO_TENSOR, SQUARES] = np.nan  # no tensor: no figure
        return rows
    return written if written.shape[1] == 4 else None


def rank_of(worker: str) -> int:
    """``worker_3`` -> 3 (smdebug's worker names)."""
    try:
        return int(worker.rsplit("_", 1)[-1])
    except ValueError:
        return -1


@dataclass(frozen=True)
class Disagreement:
    """One tensor whose ranks disagree at one step."""

    name: str
    # the ranks outside the largest group of equal values; every rank when no group is larger
    # than all others (two ranks that disagree: which one is off cannot be told)
    odd_ranks: tuple[int, ...]
    reference_rank: int  # the lowest rank of the largest group, or -1 without a majority
    norms: dict[int, float]  # rank -> the tensor's L2 norm there
    relative: float  # the largest relative difference of the sums of squares from the reference


def _same(a: np.ndarray, b: np.ndarray, tolerance: float) -> bool:
    if a[HASH] == b[HASH]:
        return True
    if tolerance <= 0 or NO_TENSOR in (a[HASH], b[HASH]):
        return False
    for column in (SUM, SQUARES):
        if column == SUM and np.isnan(a[SUM]) and np.isnan(b[SUM]):
            continue  # not computed (the hook writes the sum of squares only; older files hold both)
        scale = max(abs(a[column]), abs(b[column]), np.finfo(np.float32).tiny)
        if not abs(a[column] - b[column]) <= tolerance * scale:  # (a NaN is never within it)
            return False
    return True


def compare_ranks(
    by_worker: Mapping[str, tuple[Sequence[str], np.ndarray]],
    *,
    sharded: set[str],
    tolerance: float,
) -> tuple[list[Disagreement], set[str]]:
    """(tensors the ranks disagree on, tensors not judged) at one step.

    A tensor is judged where at least two ranks hold it, none declares it sharded, and all hold
    it with the same number of elements. Ranks are grouped by equal values; a group larger than
    every other is the reference and the other ranks are odd; without one, every rank is."""
    rows_by_name: dict[str, dict[int, np.ndarray]] = {}
    for worker, (names, rows) in by_worker.items():
        rank = rank_of(worker)
        for index, name in enumerate(names[: len(rows)]):
            rows_by_name.setdefault(name, {})[rank] = rows[index]
    disagreements: list[Disagreement] = []
    unjudged: set[str] = set()
    for name, by_rank in rows_by_name.items():
        if name in sharded or len({float(row[ELEMENTS]) for row in by_rank.values() if row[HASH] != NO_TENSOR}) > 1:
            unjudged.add(name)
            continue
        if len(by_rank) < 2:
            continue
        groups: list[list[int]] = []
        for rank in sorted(by_rank):
            for group in groups:
                if _same(by_rank[group[0]], by_rank[rank], tolerance):
                    group.append(rank)
                    break
            else:
                groups.append([rank])
        if len(groups) == 1:
            continue
        reference = max(groups, key=lambda group: (len(group), -group[0]))
        if sum(len(group) == len(reference) for group in groups) > 1:
            # no majority (two ranks, or every rank its own values): which is off cannot be told
            odd, reference_rank = tuple(sorted(by_rank)), -1
        else:
            odd = tuple(sorted(rank for group in groups if group is not reference for rank in group))
            reference_rank = reference[0]
        base = by_rank[reference[0]]
        relative = max(
            abs(by_rank[rank][SQUARES] - base[SQUARES]) / max(abs(base[SQUARES]), np.finfo(np.float32).tiny)
            for rank in odd
        )
        disagreements.append(
            Disagreement(name, odd, reference_rank,
                         {rank: float(np.sqrt(max(row[SQUARES], 0.0))) for rank, row in by_rank.items()},
                         float(relative))  # fmt: skip
        )
    return disagreements, unjudged
