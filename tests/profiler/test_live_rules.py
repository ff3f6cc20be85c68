"""Profiler rules live under ``trainguard run --profile --rules``: which rules, their names, what
stops training (a confirmed input stall only), and what a rule says when it cannot judge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.profiler._synthetic import write_steps, write_system
from trainguard.cli import build_parser
from trainguard.errors import ConfigError
from trainguard.launch.options import rule_specs
from trainguard.rules import RuleSpec, create_rule
from trainguard.rules.defaults import DEFAULT_RULES
from trainguard.rules.profiler_defaults import DEFAULT_PROFILER_RULES


def _specs(*argv: str) -> list[RuleSpec]:
    args = build_parser().parse_args(["run", *argv, "--", "python", "x.py"])
    return rule_specs(args)


def test_profile_adds_the_profiler_rules_to_the_default_set() -> None:
    plain = [spec.name for spec in _specs("--rules")]
    assert plain == list(DEFAULT_RULES)
    profiled = [spec.name for spec in _specs("--profile", "--rules")]
    assert profiled == list(DEFAULT_RULES) + list(DEFAULT_PROFILER_RULES)
    assert [spec.name for spec in _specs("--profile-interval-ms", "200", "--stop-on-issue")] == profiled
    assert {"StepOutlier", "Dataloader", "LowGPUUtilization", "OverallSystemUsage"} <= set(DEFAULT_PROFILER_RULES)


def test_two_configurations_of_one_rule_by_name() -> None:
    specs = _specs("--rules", "StepOutlier:name=fast,stddev=3", "--rules", "StepOutlier:name=slow,stddev=6,n_outliers=2")
    assert [(s.name, s.rule, dict(s.parameters)) for s in specs] == [
        ("fast", "StepOutlier", {"stddev": "3"}),
        ("slow", "StepOutlier", {"stddev": "6", "n_outliers": "2"}),
    ]
    with pytest.raises(ConfigError, match="two configurations are named 'StepOutlier'"):
        _specs("--rules", "StepOutlier:stddev=3", "--rules", "StepOutlier:stddev=6")
    with pytest.raises(ConfigError, match="named 'fast'"):
        _specs("--rules", "StepOutlier:name=fast,stddev=3,Dataloader:name=fast")
    with pytest.raises(ConfigError, match="needs a configuration name"):
        _specs("--rules", "StepOutlier:name=")
    # a configuration of the default set is still replaced by one named after it
    override = _specs("--profile", "--rules", "--rules", "StepOutlier:stddev=4")
    assert [dict(s.parameters) for s in override if s.name == "StepOutlier"] == [{"stddev": "4"}]


def test_step_outlier_under_its_minimum_is_not_evaluated(tmp_path: Path) -> None:
    durations = np.full(60, 0.1)
    durations[::20] = 2.0  # 3 slow steps: outliers once there are enough steps to judge
    write_steps(tmp_path, durations)
    rule = create_rule(str(tmp_path), RuleSpec.parse("StepOutlier:n_outliers=1"))
    assert rule.check_idle(0.0) is None  # live: no verdict yet, not "no issues"
    result = rule.finish()
    assert not result.fired and result.not_evaluated == "60 steps, needs more than 100"
    write_steps(tmp_path, np.full(60, 0.1), start=1_700_100_000.0, first_step=60)
    every = np.concatenate([durations, np.full(60, 0.1)])
    assert np.count_nonzero(every > every.mean() + 3 * every.std()) == 3  # the oracle: 3 > n_outliers
    assert create_rule(str(tmp_path), RuleSpec.parse("StepOutlier:n_outliers=1")).finish().fired  # 120 steps


def test_gpu_rules_without_gpu_metrics_say_so(tmp_path: Path) -> None:
    write_system(tmp_path, {("cpu0", "CPUUtilization"): np.full(50, 40.0)})
    for name in ("LowGPUUtilization", "GPUMemoryIncrease", "LoadBalancing"):
        result = create_rule(str(tmp_path), RuleSpec.parse(name)).finish()
        assert not result.fired and "no GPU metrics" in (result.not_evaluated or ""), name
        assert result.not_applicable, name  # the run's design, not missing data


def _stall_shares(rule_spec: str, shares: list[float], run: Path) -> object:
    durations = np.full(len(shares), 0.1)
    write_steps(run, durations, data=durations * np.asarray(shares))
    return create_rule(str(run), RuleSpec.parse(rule_spec)).finish()


@pytest.mark.parametrize(
    ("shares", "fired", "certain"),
    [
        ([0.9] * 41, True, True),  # stalled throughout: confirmed in both last windows of 10
        ([0.9] * 15, True, False),  # stalled, but fewer than 2 x patience steps
        ([0.9] * 30 + [0.1] * 11, True, False),  # the stall ended: the last window is fine
        ([0.1] * 30 + [0.9] * 11, False, False),  # a fresh stall: the run's median is still low
        ([0.1] * 20 + [0.99] + [0.1] * 20, False, False),  # one slow batch is no stall
    ],
)
def test_dataloader_stall_is_certain_only_when_confirmed(
    tmp_path: Path, shares: list[float], fired: bool, certain: bool
) -> None:
    result = _stall_shares("Dataloader:patience=10", shares, tmp_path)
    usable = np.asarray(shares[1:])  # the first step is skipped (worker start-up)
    assert (np.median(usable) > 0.5) == fired  # the oracle of the firing condition
    last, before = usable[-10:], usable[-20:-10]
    oracle_certain = fired and len(usable) >= 20 and np.median(last) > 0.5 and np.median(before) > 0.5
    assert result.fired == fired and result.certain == certain == oracle_certain


SCRIPT = """
import sys, time
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
steps, delay = int(sys.argv[1]), float(sys.argv[2])
x = torch.randn(steps * 16, 64)
y = (x @ torch.randn(64, 4)).argmax(1)  # learnable labels: the debugger rules stay silent
model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
def collate(batch):
    time.sleep(delay)  # a slow decoder or a slow disk
    return torch.utils.data.default_collate(batch)
for xb, yb in DataLoader(TensorDataset(x, y), batch_size=16, collate_fn=collate):
    loss = nn.functional.cross_entropy(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("trained", flush=True)
"""


def _trainguard_run(tmp_path: Path, steps: int, delay: float, *flags: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    command = [sys.executable, "-m", "trainguard.cli", "run", "--out", str(tmp_path / "run"),
               "--profile-interval-ms", "100", *flags, "--", sys.executable, str(script), str(steps), str(delay)]  # fmt: skip
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600, cwd=tmp_path)


def _outputs(run: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (run / "rule-output").glob("*.json")}


@pytest.mark.slow
def test_a_live_input_stall_stops_training(tmp_path: Path) -> None:
    """The default set under --profile --stop-on-issue: up to 300 steps of 16 items, each batch 0.3 s
    in collate; the stop comes once the stall is confirmed (a few dozen steps), not at the end."""
    done = _trainguard_run(tmp_path, 300, 0.3, "--stop-on-issue")
    assert done.returncode == 3, done.stderr[-3000:]
    assert "trained" not in done.stdout
    stop = json.loads((tmp_path / "run" / "trainguard-stop.json").read_text())
    assert stop["triggered_by"]["rule"] == "Dataloader" and stop["certain"] is True
    assert "waiting for data" in stop["triggered_by"]["message"]


@pytest.mark.slow
def test_a_healthy_profiled_run_is_judged_by_the_profiler_rules_live(tmp_path: Path) -> None:
    done = _trainguard_run(tmp_path, 150, 0.0, "--rules")
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = _outputs(tmp_path / "run")
    assert set(DEFAULT_PROFILER_RULES) <= set(outputs)
    assert outputs["Dataloader"]["status"] == "NoIssuesFound" and not outputs["Dataloader"]["findings"]
    assert outputs["StepOutlier"]["status"] in {"NoIssuesFound", "IssuesFound"}  # evaluated: 150 > 100 steps
    assert not any(f.get("certain") for output in outputs.values() for f in output["findings"])
    if not any(m.dimension == "GPUUtilization" for m in _system_metrics(tmp_path / "run")):
        assert "no GPU metrics" in outputs["LowGPUUtilization"]["status_details"]
        assert outputs["LowGPUUtilization"]["not_applicable"] is True
        assert "not applicable to this run" in done.stdout and "LowGPUUtilization" in done.stdout


def _system_metrics(run: Path) -> list:
    from trainguard.profiler import read_system_metrics

    return list(read_system_metrics(run))


def test_overall_system_usage_statistics_reach_the_output(tmp_path: Path) -> None:
    """rule-output/, the runner's updates (rules run --json) and the summary carry the percentiles."""
    import torch

    import trainguard.pytorch as tg
    from trainguard.rules.runner import RuleRunner
    from trainguard.summary import render_rule_results

    run = tmp_path / "run"
    model = torch.nn.Linear(4, 1)
    hook = tg.Hook(out_dir=str(run), save_config=tg.SaveConfig(save_interval=1))
    hook.register_module(model)
    for _ in range(3):
        model(torch.randn(8, 4)).sum().backward()
    hook.close()
    rng = np.random.default_rng(3)
    total, io = rng.uniform(0, 100, 120), rng.uniform(0, 20, 120)
    write_system(run, {("cpu", "TotalCPUUtilization"): total, ("cpu0", "CPUUtilization"): total,
                       ("cpu", "TotalI/OWaitPercentage"): io})  # fmt: skip
    updates: list = []
    final = RuleRunner(str(run), [RuleSpec.parse("OverallSystemUsage")], wait_timeout=5, on_update=updates.append).run()
    output = json.loads((run / "rule-output" / "OverallSystemUsage.json").read_text())
    assert output["status"] == "NoIssuesFound"
    for key, values in (("algo-1/cpu/TotalCPUUtilization", total), ("algo-1/cpu/TotalI/OWaitPercentage", io)):
        oracle = np.percentile(values, [50, 95, 99])
        assert [output["statistics"][key][p] for p in ("p50", "p95", "p99")] == pytest.approx(oracle)
    assert final["OverallSystemUsage"].statistics == output["statistics"]
    assert updates[-1].to_dict()["statistics"] == output["statistics"]  # the --json line
    text = render_rule_results([output])
    assert f"algo-1/cpu/TotalCPUUtilization: p50 {np.percentile(total, 50):.4g}" in text
    assert "cpu0/CPUUtilization" not in text  # per-core lines give way to the machine's total
