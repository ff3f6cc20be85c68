"""Per-tensor numpy work of one rule on two cores.

The tensor rules spend their time in numpy passes over large arrays (sums, norms, selections),
and numpy releases the GIL in them. :func:`map_tensors` splits a rule's tensors in two halves by
size and works on one half in a helper thread while the calling thread does the other: the
same function on the same arrays, results in the input order, so the rule's findings are exactly
what the one-thread loop gives. Small work stays on the calling thread (a handoff costs more).

The function must be pure numpy on its own arrays and set its own ``np.errstate`` (numpy's
error state is per thread).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

__all__ = ["map_tensors"]

T = TypeVar("T")

# Below this many bytes in all, the helper thread's handoff (tens of microseconds) costs more
# than it saves.
PARALLEL_MIN_BYTES = 1 << 20

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool_after_fork() -> None:
    # A forked child inherits the pool object but not its thread: work submitted to it would
    # wait forever. The child starts its own on first use.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


def _helper() -> ThreadPoolExecutor | None:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None and (os.cpu_count() or 1) > 1:
                _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainguard-rules")
    return _pool


def map_tensors(fn: Callable[[str, np.ndarray], T], arrays: dict[str, np.ndarray]) -> dict[str, T]:
    """``{name: fn(name, array)}`` in ``arrays``' order, large work split over two threads."""
    items = list(arrays.items())
    sizes = [getattr(array, "nbytes", 0) for _, array in items]
    pool = _helper() if len(items) > 1 and sum(sizes) >= PARALLEL_MIN_BYTES else None
    if pool is None:
        return {name: fn(name, array) for name, array in items}
    # Largest first, each to the lighter half: two halves of about equal bytes.
    halves: tuple[list[int], list[int]] = ([], [])
    loads = [0, 0]
    for index in sorted(range(len(items)), key=lambda i: -sizes[i]):
        lighter = 0 if loads[0] <= loads[1] else 1
        halves[lighter].append(index)
        loads[lighter] += sizes[index]

    def run(indices: list[int]) -> dict[int, Any]:
        done: dict[int, Any] = {}
        for index in indices:
            try:
                done[index] = fn(*items[index])
            except Exception as error:  # noqa: BLE001 - re-raised below, in input order
                done[index] = _Failed(error)
        return done

    future = pool.submit(run, halves[1])
    results = run(halves[0])
    results.update(future.result())
    mapped = {}
    for index, (name, _) in enumerate(items):
        result = results[index]
        if isinstance(result, _Failed):  # the first failure in input order, as the plain loop
            raise result.error
        mapped[name] = result
    return mapped


class _Failed:
    def __init__(self, error: Exception) -> None:
        self.error = error
