"""compute_reductions on data where naive formulas go wrong, against float64 numpy oracles."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainguard.hooks.torch_tensors import compute_reductions  # noqa: E402

REQUESTED = (("min", False), ("max", False), ("mean", False), ("std", False), ("variance", False),
             ("l2", False), ("zero_fraction", False), ("std", True))  # fmt: skip


def oracle(data: np.ndarray) -> list[float]:
    data = data.astype(np.float64)
    return [data.min(), data.max(), data.mean(), data.std(), data.var(), np.sqrt((data**2).sum()),
            float((data == 0).mean()), np.abs(data).std()]  # fmt: skip


@pytest.mark.parametrize(
    "data",
    [
        np.full(10_000, 0.5, dtype=np.float32),  # constant: std must be exactly 0, not rounding noise
        (1000.0 + 1e-3 * np.random.default_rng(0).standard_normal(200_000)).astype(np.float32),  # |mean| >> std
        np.random.default_rng(1).standard_normal((256, 784)).astype(np.float32),
        np.array([0.0, 0.0, 3.0], dtype=np.float32),
        np.array([7.0], dtype=np.float32),
    ],
    ids=["constant", "large-offset", "weight-like", "zeros", "single"],
)
def test_reductions_match_float64_numpy(data):
    got = compute_reductions(torch.from_numpy(data), REQUESTED).numpy()
    expected = oracle(data)
    assert got.dtype == np.float64
    # float32 arithmetic where the tensor lives: sums of 200k float32 values carry ~1e-5 relative error;
    # the spread, though, must not lose its digits to a large mean (E[x^2] - E[x]^2 would: std 0.001
    # next to a mean of 1000 leaves nothing in float32)
    np.testing.assert_allclose(got, expected, rtol=5e-5, atol=1e-7 * float(np.abs(data).max()))


def test_constant_tensor_has_no_spread_beyond_float32_rounding():
    got = compute_reductions(torch.full((4096,), 0.1), (("std", False), ("variance", False))).numpy()
    assert 0 <= got[0] <= 1e-6 * 0.1 and 0 <= got[1] <= 1e-12


def test_integer_and_half_tensors_are_reduced_in_float():
    ints = torch.arange(10, dtype=torch.int32)
    halves = torch.linspace(-1, 1, 101, dtype=torch.float16)
    np.testing.assert_allclose(
        compute_reductions(ints, (("mean", False), ("std", False))).numpy(), [4.5, np.arange(10).std()]
    )
    np.testing.assert_allclose(
        compute_reductions(halves, (("mean", False), ("max", True))).numpy(),
        [halves.float().mean().item(), 1.0], atol=1e-6,
    )  # fmt: skip


def test_batched_reductions_equal_one_tensor_at_a_time():
    """The writer reduces a step's CPU copies together; every row must equal the lone computation."""
    from trainguard.hooks.torch_tensors import DeferredReductions

    generator = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(64, 32, generator=generator), torch.randn(32, generator=generator), torch.zeros(7),
        torch.randn(3, 3, generator=generator, dtype=torch.float64), torch.arange(12, dtype=torch.int16),
        torch.randn(5, generator=generator).half(), torch.randn(4, generator=generator, dtype=torch.complex64),
    ]  # fmt: skip
    full = (*REQUESTED, ("l1", False), ("sum", False), ("prod", False), ("mean", True), ("variance", True))
    items = [DeferredReductions(tensor, full) for tensor in tensors] + [DeferredReductions(tensors[0], full[:2])]
    for item, row in zip(items, DeferredReductions.resolve_many(items), strict=True):
        assert row.dtype == np.float64 and row.shape == (len(item.requested),)
        np.testing.assert_allclose(row, compute_reductions(item.tensor, item.requested).numpy(), rtol=1e-6, atol=1e-12)


def test_norms_of_a_large_tensor_keep_float32_precision():
    """torch's float32 CPU norms accumulate in float32: 20 M elements put l2 off by 1e-3 and l1 by 3e-2.

    Chunked accumulation (float64 across chunks) must keep every reduction within the promised 5e-5.
    """
    data = (0.5 + 3.0 * np.random.default_rng(2).standard_normal(20_000_000)).astype(np.float32)
    requested = (("l2", False), ("l1", False), ("mean", False), ("std", False), ("min", False), ("max", False))
    got = compute_reductions(torch.from_numpy(data), requested).numpy()
    wide = data.astype(np.float64)
    expected = [np.sqrt((wide**2).sum()), np.abs(wide).sum(), wide.mean(), wide.std(), wide.min(), wide.max()]
    np.testing.assert_allclose(got, expected, rtol=5e-5)


def test_non_finite_values_propagate_as_numpy_does():
    data = np.array([1.0, np.nan, 3.0], dtype=np.float32), np.array([1.0, np.inf, -2.0], dtype=np.float32)
    requested = (("min", False), ("max", False), ("mean", False), ("std", False), ("l2", False))
    for array in data:
        got = compute_reductions(torch.from_numpy(array), requested).numpy()
        wide = array.astype(np.float64)
        with np.errstate(invalid="ignore"):
            expected = [wide.min(), wide.max(), wide.mean(), wide.std(), np.sqrt((wide**2).sum())]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
        finite = ~np.isnan(expected)
        np.testing.assert_allclose(got[finite], np.asarray(expected)[finite])


def test_cpu_path_agrees_with_the_accelerator_path():
    """The accelerator path (all on device, two-pass spread) run on CPU tensors is the cross-check."""
    from trainguard.hooks.torch_reductions import _on_device, compute_reductions_many

    generator = torch.Generator().manual_seed(3)
    tensors = [torch.randn(256, 784, generator=generator), torch.randn(256, generator=generator) + 50.0,
               torch.full((1000,), 0.25), torch.randn(70_000, generator=generator).abs()]  # fmt: skip
    full = (*REQUESTED, ("l1", False), ("sum", False), ("mean", True), ("variance", True), ("l2", True))
    np.testing.assert_allclose(
        compute_reductions_many(tensors, full).numpy(), _on_device(tensors, full).numpy(), rtol=2e-5, atol=1e-9
    )
