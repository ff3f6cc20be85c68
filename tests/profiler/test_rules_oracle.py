"""Each profiler rule against a numpy oracle of its formula, on synthetic metric files.

The files are written with trainguard's writers (the real format); the oracle recomputes the
documented formula straight from the arrays. Parameter sets are chosen so that both outcomes
occur for every rule (asserted), so no test passes by never firing.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.profiler._synthetic import START, write_steps, write_system
from trainguard.errors import ConfigError
from trainguard.rules import RuleSpec, create_rule, get_rule_class

PROFILER_RULES = [
    "CPUBottleneck", "IOBottleneck", "LowGPUUtilization", "GPUMemoryIncrease", "BatchSize",
    "LoadBalancing", "MaxInitializationTime", "StepOutlier", "Dataloader", "OverallSystemUsage",
]  # fmt: skip


def run_rule(run: Path, spec: str):
    rule = create_rule(str(run), RuleSpec.parse(spec))
    return rule.finish()


def test_every_profiler_rule_is_registered_with_its_kind() -> None:
    for name in PROFILER_RULES:
        cls = get_rule_class(name)
        assert cls.kind == "profiler" and cls.collections == () and cls.fix_hint or name == "OverallSystemUsage"
        assert "scan_interval_us" in cls.parameters()
        module_doc = __import__(cls.__module__, fromlist=["x"]).__doc__
        assert "Formula" in module_doc or "statistics" in module_doc.lower(), name


def _bottleneck_data(rng: np.random.Generator, n: int) -> dict:
    return {
        ("gpu0", "GPUUtilization"): rng.uniform(0, 40, n),
        ("gpu1", "GPUUtilization"): rng.uniform(0, 100, n),
        ("cpu0", "CPUUtilization"): rng.uniform(50, 100, n),
        ("cpu1", "CPUUtilization"): rng.uniform(0, 100, n),
        ("cpu0", "I/OWaitPercentage"): rng.uniform(0, 80, n),
        ("cpu1", "I/OWaitPercentage"): rng.uniform(0, 30, n),
    }


@pytest.mark.parametrize("rule", ["CPUBottleneck", "IOBottleneck"])
def test_bottleneck_rules_match_oracle(tmp_path: Path, rule: str) -> None:
    rng = np.random.default_rng(1)
    n = 300
    data = _bottleneck_data(rng, n)
    write_system(tmp_path, data)
    gpus = np.stack([data[("gpu0", "GPUUtilization")], data[("gpu1", "GPUUtilization")]])
    busy_dim = "CPUUtilization" if rule == "CPUBottleneck" else "I/OWaitPercentage"
    busy = np.stack([data[("cpu0", busy_dim)], data[("cpu1", busy_dim)]])
    busy_param = "cpu_threshold" if rule == "CPUBottleneck" else "io_threshold"
    outcomes = set()
    for gpu_t, busy_t, threshold, patience in [
        (10, 90, 50, 100),
        (30, 60, 20, 100),
        (20, 50, 10, 100),
        (30, 60, 20, 400),
    ]:
        ratio = 100 * np.mean((gpus.min(axis=0) < gpu_t) & (busy.max(axis=0) > busy_t))
        expected = n > patience and ratio > threshold
        result = run_rule(
            tmp_path, f"{rule}:gpu_threshold={gpu_t},{busy_param}={busy_t},threshold={threshold},patience={patience}"
        )
        assert result.fired == expected, (gpu_t, busy_t, threshold, ratio)
        assert result.details["datapoints"] == n
        assert result.details["bottleneck_percent"] == pytest.approx(ratio, abs=0.01)
        outcomes.add(result.fired)
    assert outcomes == {True, False}


def test_bottleneck_rules_on_cpu_only_data_never_fire(tmp_path: Path) -> None:
    n = 1200
    write_system(
        tmp_path, {("cpu0", "CPUUtilization"): np.full(n, 100.0), ("cpu0", "I/OWaitPercentage"): np.full(n, 90.0)}
    )
    for rule in ("CPUBottleneck", "IOBottleneck"):
        result = run_rule(tmp_path, f"{rule}:patience=10")
        assert not result.fired and "no GPU metrics" in result.message
        assert result.details["snapshots_without_gpu"] == n


def test_low_gpu_utilization_matches_oracle(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    n = 1100
    steady = rng.uniform(60, 100, n)
    bursty = np.where(rng.random(n) < 0.2, 0.0, rng.uniform(80, 100, n))
    write_system(tmp_path, {("gpu0", "GPUUtilization"): steady, ("gpu1", "GPUUtilization"): bursty})
    outcomes = set()
    cases = [(70, 10, 500, 1000), (99.5, 10, 500, 1000), (70, 10, 100, 1000), (70, 0, 500, 1000), (70, 10, 500, 1100)]
    for p95, p5, window, patience in cases:
        expected = False
        for values in (steady, bursty):
            if len(values) > patience:
                hi, lo = np.percentile(values[-window:], [95, 5])
                expected |= bool(hi < p95 or (hi > p95 and lo < p5))
        result = run_rule(
            tmp_path, f"LowGPUUtilization:threshold_p95={p95},threshold_p5={p5},window={window},patience={patience}"
        )
        if len(steady) > patience:
            assert result is not None
        assert bool(result and result.fired) == expected, (p95, p5, window, patience)
        outcomes.add(bool(result and result.fired))
    assert outcomes == {True, False}


def _memory_oracle(values: np.ndarray, window: int, patience: int, increase: float) -> bool:
    for end in range(patience + 1, len(values) + 1):
        v = values[:end]
        if len(v) < window + 1:
            continue
        if np.mean(v[-window:]) - np.mean(v[-window - 1 : -2]) > increase:
            return True
    return False


def test_gpu_memory_increase_matches_oracle(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    n = 1300
    memory = 30 + rng.normal(0, 0.5, n)
    memory[1150:] += 12.0  # a leak shows up as a jump after patience
    write_system(tmp_path, {("gpu0", "GPUMemoryUtilization"): memory})
    outcomes = set()
    for increase, window, patience in [(5, 10, 1000), (20, 10, 1000), (5, 10, 1200), (1, 50, 1000), (0.5, 10, 100)]:
        expected = _memory_oracle(memory, window, patience, increase)
        result = run_rule(tmp_path, f"GPUMemoryIncrease:increase={increase},window={window},patience={patience}")
        assert result.fired == expected, (increase, window, patience)
        outcomes.add(result.fired)
    assert outcomes == {True, False}


def test_batch_size_matches_oracle(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    n = 1100
    cpu = rng.uniform(10, 60, n)
    util = rng.uniform(10, 65, n)
    memory = rng.uniform(20, 40, n)
    write_system(tmp_path, {("cpu", "TotalCPUUtilization"): cpu, ("cpu0", "CPUUtilization"): cpu,
                            ("gpu0", "GPUUtilization"): util, ("gpu0", "GPUMemoryUtilization"): memory})  # fmt: skip
    outcomes = set()
    cases = [(70, 70, 70, 500, 1000), (50, 70, 70, 500, 1000), (70, 60, 70, 100, 1000), (70, 70, 70, 500, 1100),
             (70, 70, 30, 500, 1000)]  # fmt: skip
    for cpu_t, gpu_t, mem_t, window, patience in cases:
        expected = (
            n > patience
            and np.percentile(cpu[-window:], 95) < cpu_t
            and np.percentile(util[-window:], 95) < gpu_t
            and np.percentile(memory[-window:], 95) < mem_t
        )
        spec = (f"BatchSize:cpu_threshold_p95={cpu_t},gpu_threshold_p95={gpu_t},gpu_memory_threshold_p95={mem_t},"
                f"window={window},patience={patience}")  # fmt: skip
        result = run_rule(tmp_path, spec)
        assert result.fired == bool(expected), spec
        outcomes.add(result.fired)
    assert outcomes == {True, False}


def test_batch_size_without_gpus_never_fires(tmp_path: Path) -> None:
    write_system(tmp_path, {("cpu0", "CPUUtilization"): np.full(50, 5.0)})
    result = run_rule(tmp_path, "BatchSize:patience=10,window=20")
    assert not result.fired and "gpu0" not in str(result.details)


def _js_distance(p: np.ndarray, q: np.ndarray) -> float:
    """scipy.spatial.distance.jensenshannon when scipy is installed, else its definition."""
    try:
        from scipy.spatial.distance import jensenshannon
    except ImportError:
        p, q = p / p.sum(), q / q.sum()
        m = (p + q) / 2
        with np.errstate(divide="ignore", invalid="ignore"):
            kl_pm = np.nansum(np.where(p > 0, p * np.log(p / m), 0.0))
            kl_qm = np.nansum(np.where(q > 0, q * np.log(q / m), 0.0))
        return float(np.sqrt((kl_pm + kl_qm) / 2))
    return float(jensenshannon(p, q))


def test_load_balancing_matches_jensen_shannon_oracle(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    n = 1100
    series = {
        ("gpu0", "GPUUtilization"): np.clip(rng.normal(85, 5, n), 0, 100),
        ("gpu1", "GPUUtilization"): np.clip(rng.normal(80, 8, n), 0, 100),
        ("gpu2", "GPUUtilization"): np.clip(rng.normal(25, 10, n), 0, 100),
    }
    write_system(tmp_path, series)
    edges = np.arange(0, 102, 2)
    hist = {k: np.histogram(v, bins=edges)[0] for k, v in series.items()}
    keys = list(series)
    pairs = [(a, b) for i, a in enumerate(keys) for b in keys[i + 1 :]]
    worst = max(_js_distance(hist[a], hist[b]) for a, b in pairs)
    outcomes = set()
    for threshold, patience in [(0.5, 1000), (worst + 0.01, 1000), (worst - 0.01, 1000), (0.1, 1100)]:
        result = run_rule(tmp_path, f"LoadBalancing:threshold={threshold},patience={patience}")
        fired = bool(result and result.fired)
        assert fired == (n > patience and worst > threshold), (threshold, patience, worst)
        if result is not None:
            assert max(result.details["distances"].values()) == pytest.approx(worst, abs=1e-4)
        outcomes.add(fired)
    assert outcomes == {True, False}


def test_step_outlier_matches_oracle(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    durations = rng.gamma(20, 0.005, 400)  # ~100 ms steps
    durations[rng.choice(400, 14, replace=False)] *= 4
    write_steps(tmp_path, durations)
    write_steps(tmp_path, rng.gamma(20, 0.005, 50), mode="EVAL", start=START + 1000)
    outcomes = set()
    for stddev, n_outliers, mode in [
        (3, 10, "None"),
        (3, 20, "None"),
        (2, 10, "TRAIN"),
        (5, 5, "TRAIN"),
        (3, 1, "EVAL"),
    ]:
        count = int(np.sum(durations > durations.mean() + stddev * durations.std()))
        expected = count > n_outliers and mode != "EVAL"  # 50 EVAL steps: below the 100-step minimum
        result = run_rule(tmp_path, f"StepOutlier:stddev={stddev},n_outliers={n_outliers},mode={mode}")
        assert result.fired == expected, (stddev, n_outliers, mode, count)
        outcomes.add(result.fired)
    assert outcomes == {True, False}


def test_step_outlier_rejects_unknown_mode(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mode"):
        create_rule(str(tmp_path), RuleSpec.parse("StepOutlier:mode=TRAINING"))


def test_max_initialization_time(tmp_path: Path) -> None:
    write_system(tmp_path, {("cpu0", "CPUUtilization"): np.full(100, 50.0)}, interval_s=60.0)  # 99 min of samples
    no_steps = create_rule(str(tmp_path), RuleSpec.parse("MaxInitializationTime:threshold=20"))
    assert no_steps.check_idle(START + 5 * 60).fired is False  # 5 min in: still fine
    assert no_steps.check_idle(START + 21 * 60).fired is True  # idle poll past 20 min: fires
    write_steps(tmp_path, [0.1] * 5, start=START + 25 * 60)
    assert run_rule(tmp_path, "MaxInitializationTime:threshold=20").details["initialization_s"] == pytest.approx(
        1500, abs=1
    )
    assert run_rule(tmp_path, "MaxInitializationTime:threshold=20").fired is True
    assert run_rule(tmp_path, "MaxInitializationTime:threshold=30").fired is False


def test_dataloader_matches_oracle(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    durations = rng.uniform(0.05, 0.1, 40)
    data = durations * rng.uniform(0.3, 0.8, 40)
    write_steps(tmp_path, durations, data=data, workers=1)
    share = 100 * np.median((data / durations)[1:])  # first step skipped (worker start-up)
    outcomes = set()
    for data_threshold, patience, max_threshold in [
        (50, 10, 200),
        (share + 1, 10, 200),
        (share - 1, 50, 200),
        (90, 10, 1),
    ]:
        result = run_rule(
            tmp_path, f"Dataloader:data_threshold={data_threshold},patience={patience},max_threshold={max_threshold}"
        )
        too_many = 1 > (os.cpu_count() or 1) * max_threshold / 100  # the timeline records this machine's cores
        expected = 39 > patience and (share > data_threshold or too_many)
        assert result.fired == expected, (data_threshold, patience, max_threshold, share)
        outcomes.add(result.fired)
    assert outcomes == {True, False}


def test_overall_system_usage_reports_statistics_and_never_fires(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    values = rng.uniform(0, 100, 300)
    write_system(tmp_path, {("cpu0", "CPUUtilization"): values, ("gpu0", "GPUUtilization"): values[::-1]})
    result = run_rule(tmp_path, "OverallSystemUsage")
    assert not result.fired
    stats = result.details["statistics"]["algo-1/cpu0/CPUUtilization"]
    assert stats["samples"] == 300
    assert stats["p95"] == pytest.approx(np.percentile(values, 95)) and stats["max"] == pytest.approx(values.max())


@pytest.mark.parametrize(
    "spec",
    [
        "CPUBottleneck:threshold=150",
        "LowGPUUtilization:window=0",
        "GPUMemoryIncrease:window=1",
        "Dataloader:patience=-1",
    ],
)
def test_bad_parameters_are_config_errors(tmp_path: Path, spec: str) -> None:
    with pytest.raises(ConfigError):
        create_rule(str(tmp_path), RuleSpec.parse(spec))


def test_sagemaker_string_parameters_are_accepted(tmp_path: Path) -> None:
    rule = create_rule(
        str(tmp_path),
        RuleSpec.parse(
            "CPUBottleneck:threshold=50,gpu_threshold=10,cpu_threshold=90,patience=1000,scan_interval_us=60000000"
        ),
    )
    assert (rule.threshold, rule.patience, rule.scan_interval_us) == (50.0, 1000, 60_000_000)


def test_incremental_scans_give_the_whole_run_result(tmp_path: Path) -> None:
    """Data arriving in pieces between checks: same decision and counts as one final read."""
    rng = np.random.default_rng(9)
    n = 400
    data = _bottleneck_data(rng, n)
    live = create_rule(
        str(tmp_path),
        RuleSpec.parse("CPUBottleneck:patience=100,threshold=10,gpu_threshold=30,cpu_threshold=60,scan_interval_us=1"),
    )
    seen = []
    for first in range(0, n, 37):  # uneven pieces, some straddling a minute boundary
        write_system(tmp_path, data, first=first, count=37)
        result = live.check(first)
        seen.append(result)
        assert live.check_idle(0.0) is None  # nothing new since: no result
    final = live.finish()
    whole = run_rule(tmp_path, "CPUBottleneck:patience=100,threshold=10,gpu_threshold=30,cpu_threshold=60")
    assert final.details == whole.details and final.fired == whole.fired is True
    assert any(r is not None and r.fired for r in seen)
