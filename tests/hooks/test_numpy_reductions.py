"""reduce_arrays, the torch-free CPU reductions, against float64 numpy oracles."""

import numpy as np
import pytest

from trainguard.hooks import numpy_reductions
from trainguard.hooks.numpy_reductions import reduce_arrays

REQUESTED = (("min", False), ("max", False), ("mean", False), ("std", False), ("variance", False), ("sum", False),
             ("l1", False), ("l2", False), ("zero_fraction", False), ("max", True), ("mean", True))  # fmt: skip


def oracle(array: np.ndarray) -> list[float]:
    wide = array.astype(np.float64)
    return [wide.min(), wide.max(), wide.mean(), wide.std(), wide.var(), wide.sum(), np.abs(wide).sum(),
            np.sqrt((wide**2).sum()), float((wide == 0).mean()), np.abs(wide).max(), np.abs(wide).mean()]  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_each_float_dtype_matches_the_float64_oracle(dtype):
    rng = np.random.default_rng(0)
    arrays = [(rng.standard_normal(size) * scale + offset).astype(dtype)
              for size, scale, offset in [(1000, 1.0, 0.0), (37, 2.0, 5.0), (1, 1.0, 3.0), (512, 1e-3, 10.0)]]  # fmt: skip
    arrays.append(np.zeros(16, dtype=dtype))
    table = reduce_arrays(arrays, REQUESTED)
    assert table.shape == (len(arrays), len(REQUESTED)) and table.dtype == np.float64
    rtol = 2e-3 if dtype == np.float16 else 5e-5  # float16 values widen exactly; only the sums round
    for array, row in zip(arrays, table, strict=True):
        np.testing.assert_allclose(row, oracle(array), rtol=rtol, atol=1e-9)


def test_chunked_accumulation_across_chunk_boundaries(monkeypatch):
    """Arrays longer than a chunk are summed chunk by chunk; every element counts exactly once."""
    monkeypatch.setattr(numpy_reductions, "CHUNK", 1000)
    monkeypatch.setattr(numpy_reductions, "_ONES", {})
    array = np.arange(2503, dtype=np.float32) - 1000.0  # 2 full chunks and a tail
    row = reduce_arrays([array], (("sum", False), ("l2", False), ("mean", False), ("std", False)))[0]
    wide = array.astype(np.float64)
    np.testing.assert_allclose(row, [wide.sum(), np.sqrt((wide**2).sum()), wide.mean(), wide.std()], rtol=1e-6)


def test_spread_of_an_offset_array_keeps_its_digits():
    """|mean| >> std: the moments formula would cancel; the two-pass fallback must keep the spread."""
    array = (1000.0 + 1e-3 * np.random.default_rng(1).standard_normal(100_000)).astype(np.float32)
    std, variance = reduce_arrays([array], (("std", False), ("variance", False)))[0]
    wide = array.astype(np.float64)
    np.testing.assert_allclose([std, variance], [wide.std(), wide.var()], rtol=5e-5)


def test_product_is_taken_in_the_arrays_own_dtype():
    # smdebug's semantics: a float32 product underflows where a float64 one would not
    tiny = np.full(40, 1e-2, dtype=np.float32)
    assert reduce_arrays([tiny], (("prod", False),))[0, 0] == 0.0
    assert reduce_arrays([tiny.astype(np.float64)], (("prod", False),))[0, 0] == pytest.approx(1e-80)
