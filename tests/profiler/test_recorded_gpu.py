"""GPU-only rules on committed GPU metric files (data/gpu_two_nodes, see make_gpu_two_nodes.py).

This machine has no GPU, so these files stand in for a GPU run. The expected outcomes are
recomputed here from the raw JSON lines with plain json + numpy (not trainguard's reader).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainguard.rules import RuleSpec, create_rule

RUN = Path(__file__).parent / "data" / "gpu_two_nodes"


def raw_series() -> dict[tuple[str, str, str], np.ndarray]:
    out: dict[tuple[str, str, str], list[float]] = {}
    for path in sorted(RUN.rglob("*.json")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            out.setdefault((record["NodeId"], record["Name"], record["Dimension"]), []).append(record["Value"])
    return {key: np.array(values) for key, values in out.items()}


def finish(spec: str):
    return create_rule(str(RUN), RuleSpec.parse(spec)).finish()


def test_files_hold_two_nodes_with_a_gpu_each() -> None:
    series = raw_series()
    assert {key[0] for key in series} == {"algo-1", "algo-2"}
    assert len(series[("algo-1", "gpu0", "GPUUtilization")]) == 120


def test_low_gpu_utilization_flags_the_idle_node() -> None:
    series = raw_series()
    idle_p95 = np.percentile(series[("algo-2", "gpu0", "GPUUtilization")][-50:], 95)
    busy_p95, busy_p5 = np.percentile(series[("algo-1", "gpu0", "GPUUtilization")][-50:], [95, 5])
    assert idle_p95 < 70 and busy_p95 > 70 and busy_p5 > 10  # the files are what the test claims
    result = finish("LowGPUUtilization:patience=100,window=50")
    assert result.fired and [f["node"] for f in result.details["findings"]] == ["algo-2"]
    assert result.details["findings"][0]["kind"] == "under-utilized"
    assert result.details["gpus"]["algo-2/gpu0"]["p95"] == pytest.approx(idle_p95, abs=0.01)
    assert not finish("LowGPUUtilization").fired  # default patience 1000 > 120 values: not yet decided


def test_gpu_memory_increase_finds_the_jump() -> None:
    memory = raw_series()[("algo-1", "gpu0", "GPUMemoryUtilization")]
    window = 10
    jumps = [np.mean(memory[:end][-window:]) - np.mean(memory[:end][-window - 1 : -2]) for end in range(101, 121)]
    assert max(jumps) > 5
    result = finish("GPUMemoryIncrease:patience=100")
    assert result.fired and result.details["node"] == "algo-1"
    assert result.details["increase"] == pytest.approx(next(j for j in jumps if j > 5))
    assert not finish("GPUMemoryIncrease:patience=100,increase=15").fired


def test_load_balancing_across_nodes() -> None:
    result = finish("LoadBalancing:patience=100")
    assert result.fired and "algo-2" in result.message
    assert not finish("LoadBalancing:patience=100,threshold=0.9").fired  # JS distance (ln) is at most 0.833


def test_batch_size_flags_only_the_idle_node() -> None:
    result = finish("BatchSize:patience=100,window=50")
    assert result.fired and result.details["node"] == "algo-2"
    assert result.details["stats"]["algo-1"]["gpu0"]["gpu_p95"] > 70


def test_bottleneck_rules_stay_quiet() -> None:
    # algo-2's GPU is never below 5 % and its cores never above 40 %; I/O wait stays under 5 %.
    assert not finish("CPUBottleneck:patience=100").fired
    assert not finish("IOBottleneck:patience=100").fired
