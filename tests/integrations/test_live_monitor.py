"""LiveRuleMonitor on real small PyTorch trainings captured by the hook: silent on a healthy run,
certain findings only (uncertain ones kept aside) on a diverging one, fail-open on a bad rule
configuration, bounded waits; and the core never imports Ray or Optuna."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from tests.integrations._sweeps import load_example  # noqa: E402
from trainguard.integrations.live import LiveRuleMonitor  # noqa: E402
from trainguard.rules.base import RuleStatus  # noqa: E402

toy = load_example("toy_training")


def _train_watched(monitor: LiveRuleMonitor, config: dict, out_dir: str, stop: bool = True) -> tuple[int, list]:
    polled: list = []

    def on_epoch(epoch, steps, last_saved, loss):
        started = time.monotonic()
        polled.extend(monitor.poll(wait_for_step=last_saved, timeout=30))
        # the rules caught up with a step already written; they never sat out the timeout
        assert time.monotonic() - started < 15
        return stop and bool(polled)

    with monitor:
        steps = toy.train(config, out_dir, on_epoch)
    return steps, polled


def test_healthy_run_gets_no_finding_and_every_rule_finishes(tmp_path):
    monitor = LiveRuleMonitor(str(tmp_path / "run"))
    steps, polled = _train_watched(monitor, {"lr": 0.01}, str(tmp_path / "run"))
    assert steps == toy.STEPS_PER_EPOCH * 12
    assert polled == [] and monitor.findings == [] and monitor.failed is None
    assert set(monitor.final) == {spec.name for spec in monitor.specs}
    assert RuleStatus.ISSUES_FOUND not in {update.status for update in monitor.final.values()}
    assert not monitor.running


def test_diverging_run_returns_certain_findings_only_once_each(tmp_path):
    monitor = LiveRuleMonitor(str(tmp_path / "run"))
    steps, polled = _train_watched(monitor, {"lr": 1.0}, str(tmp_path / "run"), stop=False)
    assert steps == toy.STEPS_PER_EPOCH * 12  # not stopped: every step's findings were seen
    assert polled and all(finding.certain for finding in polled)
    assert polled == monitor.findings  # poll() hands out each finding once
    keys = [(f.configuration_name, f.worker) for f in polled]
    assert len(keys) == len(set(keys))  # the first certain finding per rule, not one per step
    assert "ExplodingTensor" in {f.rule for f in polled}  # the NaN weights
    # the updates were far too large before they were certain: reported aside, never returned
    assert monitor.uncertain and not any(f.certain for f in monitor.uncertain)
    assert min(f.step for f in monitor.uncertain) < min(f.step for f in polled)


def test_bad_rule_configuration_fails_open(tmp_path):
    monitor = LiveRuleMonitor(str(tmp_path / "run"), ["NoSuchRule"])
    steps, polled = _train_watched(monitor, {"lr": 1.0}, str(tmp_path / "run"))
    assert steps == toy.STEPS_PER_EPOCH * 12 and polled == []
    assert monitor.failed and "NoSuchRule" in monitor.failed


def test_waiting_for_a_step_is_bounded(tmp_path):
    monitor = LiveRuleMonitor(str(tmp_path / "never-written"), ["ExplodingTensor"]).start()
    started = time.monotonic()
    assert monitor.poll(wait_for_step=10, timeout=0.5) == []
    assert 0.4 < time.monotonic() - started < 5
    started = time.monotonic()
    monitor.close(timeout=10)  # no capture ever appeared: closing still ends the runner
    assert time.monotonic() - started < 10 and not monitor.running


def test_core_and_live_monitor_do_not_import_ray_or_optuna():
    code = (
        "import sys, trainguard, trainguard.pytorch, trainguard.integrations.live; "
        "print(sorted(m for m in ('ray', 'optuna') if m in sys.modules))"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"
