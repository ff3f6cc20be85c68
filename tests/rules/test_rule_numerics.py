"""The faster numerics of the default rules give exactly the numbers of the plain formulas."""

from __future__ import annotations

import numpy as np
import pytest

from tests.rules.synthetic import evaluate_rule, open_trial, write_run
from trainguard.modes import ModeKeys
from trainguard.rules import RuleSpec
from trainguard.rules.builtin import _parallel
from trainguard.rules.builtin._helpers import all_finite
from trainguard.rules.builtin._parallel import map_tensors
from trainguard.rules.builtin.poor_weight_initialization import _spread
from trainguard.rules.read_cache import StepReadCache
from trainguard.rules.runner import RuleRunner


def sagemaker(spec):
    """``spec`` under SageMaker's documented single-step semantics (what the oracles below compute);
    rules without a ``semantics`` parameter are unchanged."""
    from trainguard.rules import builtin_rules

    spec = RuleSpec.parse(spec) if isinstance(spec, str) else spec
    if "semantics" not in builtin_rules()[spec.rule].parameters():
        return spec
    return RuleSpec(spec.rule, {**spec.parameters, "semantics": "sagemaker"})


def test_spread_equals_numpy_percentile_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    for case in range(600):
        n = int(rng.integers(2, 5000))
        dtype = (np.float16, np.float32, np.float64)[case % 3]
        array = rng.standard_normal(n)
        if case % 4 == 1:
            array = np.round(array, 1)  # many ties
        if case % 4 == 2:
            array[: n // 2] = 0.0
        array = array.astype(dtype)
        p5, p95 = np.percentile(array.astype(np.float64), [5, 95])
        assert _spread(array) == float(p95 - p5), (n, dtype)
    matrix = rng.standard_normal((64, 33)).astype(np.float32)
    p5, p95 = np.percentile(matrix.astype(np.float64), [5, 95])
    assert _spread(matrix) == float(p95 - p5)


def test_map_tensors_matches_the_plain_loop_on_two_threads(monkeypatch) -> None:
    monkeypatch.setattr(_parallel, "PARALLEL_MIN_BYTES", 0)  # split even these small arrays
    rng = np.random.default_rng(0)
    arrays = {f"t{index}": rng.standard_normal(1000 * (index + 1)).astype(np.float32) for index in range(7)}
    norm = lambda name, array: float(np.einsum("i,i->", array, array, dtype=np.float64))  # noqa: E731
    assert list(map_tensors(norm, arrays).items()) == [(name, norm(name, array)) for name, array in arrays.items()]

    def fails(name: str, array: np.ndarray) -> float:
        if name in ("t2", "t5"):
            raise ValueError(name)
        return 0.0

    with pytest.raises(ValueError, match="t2"):  # the first failure in input order, as the loop
        map_tensors(fails, arrays)


def _big_run(tmp_path, steps: int = 4) -> str:
    rng = np.random.default_rng(1)
    data = {}
    for step in range(steps):
        weight = rng.standard_normal((300, 400)).astype(np.float32)
        data[step] = {
            "fc.weight": weight,
            "gradient/fc.weight": (rng.standard_normal((300, 400)) * 1e-3).astype(np.float32),
            "gradient/fc.bias": rng.standard_normal(300).astype(np.float32) * (step != 2),  # vanishes at 2
            "relu_input": rng.standard_normal((32, 300)).astype(np.float32),
            "relu_output": np.maximum(rng.standard_normal((32, 300)), 0).astype(np.float32),
            "loss": np.float32(1.0 / (step + 1)),
        }
    data[3]["gradient/fc.weight"][5, 7] = np.nan
    collections = {
        "weights": ["fc.weight"],
        "gradients": ["gradient/fc.weight", "gradient/fc.bias"],
        "relu_input": ["relu_input"],
        "relu_output": ["relu_output"],
        "losses": ["loss"],
    }
    return write_run(tmp_path / "run", data, collections=collections, modes=ModeKeys.TRAIN)


def test_rule_numbers_equal_the_reference_formulas(tmp_path) -> None:
    path = _big_run(tmp_path)
    trial = open_trial(path)
    results = {r.step: r for r in evaluate_rule(path, sagemaker("VanishingGradient"))}
    for step in (0, 1):
        gradients = trial.tensor_values(["gradient/fc.weight", "gradient/fc.bias"], step)
        expected = min(float(np.mean(np.abs(value.astype(np.float64)))) for value in gradients.values())
        assert results[step].details["min_mean_abs"] == expected
    assert results[2].fired  # the all-zero bias gradient vanished
    assert "gradient/fc.weight" not in results[3].details.get("vanished", {})  # NaN: skipped, not vanished
    exploding = {r.step: r for r in evaluate_rule(path, sagemaker("ExplodingTensor"))}
    assert exploding[3].details["tensors"] == {"gradient/fc.weight": {"nan": 1, "inf": 0, "size": 120000}}
    assert [step for step, r in exploding.items() if r.fired] == [3]
    ratios = {r.step: r for r in evaluate_rule(path, sagemaker("WeightUpdateRatio"))}
    for step in (1, 2, 3):
        now, before = (trial.tensor("fc.weight").value(s).ravel() for s in (step, step - 1))
        diff = now - before
        expected = float(np.sqrt(np.einsum("i,i->", diff, diff, dtype=np.float64))) / (
            float(np.sqrt(np.einsum("i,i->", before, before, dtype=np.float64))) + 1e-9
        )
        assert ratios[step].details["min_ratio"] == expected


def test_runner_shares_finiteness_and_gives_the_same_findings(tmp_path) -> None:
    path = _big_run(tmp_path)
    names = ["ExplodingTensor", "VanishingGradient", "PoorWeightInitialization", "DeadRelu", "WeightUpdateRatio"]
    alone = {}
    for name in names:
        alone[name] = [r.to_dict() for r in evaluate_rule(path, sagemaker(name))]
    found: dict[str, list[dict]] = {name: [] for name in names}

    def collect(update) -> None:  # type: ignore[no-untyped-def]
        if update.result is not None and update.result.fired:
            found[update.configuration_name].append(update.result.to_dict())

    RuleRunner(path, [sagemaker(name) for name in names], output_dir=str(tmp_path / "out"), on_update=collect).run()
    assert found["ExplodingTensor"] and found["VanishingGradient"]  # the run has findings to compare
    for name in names:
        fired = [result for result in alone[name] if result["fired"]]
        # the runner names the worker it evaluated; a rule evaluated alone on the trial may not
        assert [{**r, "worker": None} for r in found[name]] == [{**r, "worker": None} for r in fired], name


def test_all_finite_is_computed_once_per_tensor_and_step(tmp_path) -> None:
    path = _big_run(tmp_path)
    trial = open_trial(path)
    cache = StepReadCache(trial)
    value = trial.tensor_values(["gradient/fc.weight"], 3)["gradient/fc.weight"]
    assert all_finite(trial, 3, "gradient/fc.weight", value) is False
    calls = []
    original = np.isfinite

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return original(*args, **kwargs)

    np.isfinite, saved = counting, np.isfinite
    try:
        assert all_finite(trial, 3, "gradient/fc.weight", value) is False  # from the cache: no pass
    finally:
        np.isfinite = saved
    assert calls == [] and cache.misses == 1
    assert all_finite(trial, 3, "x", np.array([1, 2])) is True  # integers are finite
    assert all_finite(trial, 3, "x", np.array(["a"])) is False  # strings are not numbers


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_map_tensors_works_in_a_forked_child(monkeypatch) -> None:
    """A child forked after the helper thread started must not wait on the parent's thread."""
    import multiprocessing

    monkeypatch.setattr(_parallel, "PARALLEL_MIN_BYTES", 0)
    arrays = {"a": np.ones(10), "b": np.arange(10.0)}
    assert map_tensors(lambda name, array: float(array.sum()), arrays) == {"a": 10.0, "b": 45.0}
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        result = pool.apply_async(_sum_in_child, (arrays,))
        assert result.get(timeout=30) == {"a": 10.0, "b": 45.0}


def _sum_in_child(arrays: dict) -> dict:
    _parallel.PARALLEL_MIN_BYTES = 0
    return map_tensors(lambda name, array: float(array.sum()), arrays)
