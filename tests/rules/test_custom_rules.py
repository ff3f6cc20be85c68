"""Custom rules: ``module:Class`` paths, the ``trainguard.rules`` entry-point group (a real
dist-info on sys.path), smdebug-style rules, and the ``trainguard rules`` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.rules.synthetic import write_run
from trainguard.cli import main as cli_main
from trainguard.errors import ConfigError
from trainguard.rules import RuleSpec, RuleStatus
from trainguard.rules.compat import resolve_rule_class
from trainguard.rules.runner import RuleRunner

REPO = Path(__file__).resolve().parents[2]

SMDEBUG_STYLE = '''
import numpy as np


class TensorUnavailableForStep(Exception):
    """Stands in for smdebug.exceptions.TensorUnavailableForStep (matched by name)."""


class CustomGradientRule:
    """Fires when the mean |gradient| of a tensor exceeds threshold (smdebug's custom-rule example)."""

    def __init__(self, base_trial, threshold=10.0, skip_step=-1):
        self.base_trial = base_trial
        self.threshold = threshold
        self.skip_step = skip_step

    def invoke_at_step(self, step):
        if step == self.skip_step:
            raise TensorUnavailableForStep(f"nothing at {step}")
        for name in self.base_trial.tensor_names(regex="gradient"):
            if np.abs(self.base_trial.tensor(name).value(step)).mean() > self.threshold:
                return True
        return False
'''

COMPAT_STYLE = """
from trainguard.rules.compat import Rule, RuleEvaluationConditionMet


class PortedRule(Rule):
    def __init__(self, base_trial, action_str="", limit=1.0, tensor="gradient/w"):
        super().__init__(base_trial, action_str=action_str)
        self.limit = limit
        self.tensor = tensor

    def invoke_at_step(self, step):
        value = self.base_trial.tensor(self.tensor).value(step)
        if value.max() > 100 * self.limit:
            raise RuleEvaluationConditionMet(self.rule_name, step)  # some rules raise it themselves
        return bool(value.max() > self.limit)
"""

PLUGIN = '''
from trainguard.rules import Param, Rule


class PluginRule(Rule):
    """Plug-in rule: fires when any gradient is exactly zero everywhere."""

    rule_name = "PluginRule"
    collections = ("gradients",)
    fix_hint = "check the parameter is used in forward()"
    minimum = Param(int, 1, "steps before it may fire")

    def check(self, step):
        for name in self.base_trial.tensor_names(regex="^gradient", step=step):
            if step >= self.minimum and not self.base_trial.tensor(name).value(step).any():
                return self.issue(step, f"{name} is all zeros")
        return self.no_issue(step)
'''


def _gradients(big_at: set[int], zero_at: set[int] = frozenset()) -> dict:
    steps = {}
    for step in range(8):
        value = 50.0 if step in big_at else (0.0 if step in zero_at else 0.5)
        steps[step] = {"gradient/w": np.full(4, value, dtype=np.float32)}
    return steps


@pytest.fixture
def rule_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with the rule modules and a plug-in distribution (dist-info with an entry point)."""
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "smd_style_rules.py").write_text(SMDEBUG_STYLE)
    (folder / "compat_rules.py").write_text(COMPAT_STYLE)
    (folder / "tg_plugin_rules.py").write_text(PLUGIN)
    dist = folder / "tg_plugin_rules-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tg-plugin-rules\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[trainguard.rules]\nZeroGradient = tg_plugin_rules:PluginRule\n")
    monkeypatch.syspath_prepend(str(folder))
    for name in ("smd_style_rules", "compat_rules", "tg_plugin_rules"):
        sys.modules.pop(name, None)
    return folder


def test_smdebug_style_rule_by_module_path(tmp_path: Path, rule_modules: Path) -> None:
    run = write_run(tmp_path / "run", _gradients({3, 5}))
    spec = RuleSpec.parse("smd_style_rules:CustomGradientRule:threshold=20.0,skip_step=5")
    final = RuleRunner(run, [spec]).run()
    update = final["smd_style_rules:CustomGradientRule"]
    assert update.status == RuleStatus.ISSUES_FOUND
    assert update.status_details.startswith(
        "RuleEvaluationConditionMet: Evaluation of the rule CustomGradientRule at step 3 "
    )
    findings = json.loads((Path(run) / "rule-output" / "smd_style_rules:CustomGradientRule.json").read_text())[
        "findings"
    ]
    # step 5 raised smdebug's TensorUnavailableForStep: skipped, as smdebug's invoker did
    assert [f["step"] for f in findings] == [3]
    # strings from the command line became the constructor defaults' types
    assert resolve_rule_class("smd_style_rules:CustomGradientRule").name() == "CustomGradientRule"


def test_compat_base_class_and_its_exception(tmp_path: Path, rule_modules: Path) -> None:
    run = write_run(tmp_path / "run", {0: {"gradient/w": np.ones(2)}, 1: {"gradient/w": np.full(2, 5.0)},
                                       2: {"gradient/w": np.full(2, 500.0)}})  # fmt: skip
    final = RuleRunner(run, [RuleSpec("compat_rules:PortedRule", {"limit": "2"}, "ported")]).run()
    assert final["ported"].status == RuleStatus.ISSUES_FOUND
    findings = json.loads((Path(run) / "rule-output" / "ported.json").read_text())["findings"]
    assert [f["step"] for f in findings] == [1, 2]
    assert "Evaluation of the rule PortedRule at step 2" in findings[1]["message"]


def test_smdebug_style_parameter_errors(rule_modules: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"CustomGradientRule: unknown parameter\(s\) thresh; its constructor takes: threshold, skip_step",
    ):
        RuleRunner("/nonexistent", [RuleSpec.parse("smd_style_rules:CustomGradientRule:thresh=1")]).run()
    with pytest.raises(ConfigError, match="parameter threshold: parameter value 'high' is not a valid float"):
        RuleRunner("/nonexistent", [RuleSpec.parse("smd_style_rules:CustomGradientRule:threshold=high")])
    with pytest.raises(ConfigError, match="cannot import no_such_module"):
        RuleRunner("/nonexistent", [RuleSpec.parse("no_such_module:Rule")])
    with pytest.raises(ConfigError, match="is not a rule"):
        RuleRunner("/nonexistent", [RuleSpec.parse("json:JSONDecoder")])


def test_entry_point_plugin(tmp_path: Path, rule_modules: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", _gradients(set(), zero_at={4}))
    final = RuleRunner(run, [RuleSpec("ZeroGradient")]).run()
    assert final["ZeroGradient"].status == RuleStatus.ISSUES_FOUND
    assert "at step 4" in final["ZeroGradient"].status_details
    assert cli_main(["rules", "list"]) == 0
    listing = capsys.readouterr().out
    assert "ZeroGradient  [debugger]  Plug-in rule: fires when any gradient is exactly zero everywhere." in listing
    assert "minimum=1" in listing
    assert "VanishingGradient  [debugger]" in listing and "threshold=1e-07" in listing
    # an unknown name lists the installed plug-ins too
    with pytest.raises(ConfigError, match="installed plug-ins: ZeroGradient"):
        resolve_rule_class("NoSuchRule")


def _cli(*args: str, pythonpath: str = "") -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, str(REPO)) if p)}
    command = [sys.executable, "-m", "trainguard.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=environment,
                          timeout=120)  # fmt: skip


def test_cli_rules_run_exit_codes_and_json(tmp_path: Path, rule_modules: Path) -> None:
    issues = write_run(tmp_path / "issues", _gradients({2}))
    healthy = write_run(tmp_path / "healthy", _gradients(set()))
    rule = "smd_style_rules:CustomGradientRule:threshold=20"
    found = _cli("rules", "run", issues, "--rule", rule, "--json", pythonpath=str(rule_modules))
    assert found.returncode == 1, found.stderr
    lines = [json.loads(line) for line in found.stdout.splitlines()]
    assert lines[0]["status"] == "InProgress"
    assert any(line["result"] and line["result"]["fired"] and line["result"]["step"] == 2 for line in lines)
    assert lines[-2]["status"] == "IssuesFound"
    # the last line is the run's diagnosis: this rule's first finding is the primary one
    (primary,) = lines[-1]["diagnosis"]["primary"]
    assert primary["step"] == 2 and primary["worker"] == "worker_0"
    clean = _cli(
        "rules", "run", healthy, "--rule", rule, "--progress", str(tmp_path / "p.json"), pythonpath=str(rule_modules)
    )
    assert clean.returncode == 0, clean.stderr
    assert "CustomGradientRule  NoIssuesFound" in clean.stdout.replace("smd_style_rules:", "")
    text = _cli("rules", "run", issues, "--rule", rule, pythonpath=str(rule_modules))
    assert text.returncode == 1
    table = text.stdout[text.stdout.index("final status") :]
    # the final table leads with the diagnosis: the finding and its fix
    assert table.splitlines()[1].startswith("  diagnosis   : CustomGradientRule at step 2")
    ranged = _cli(
        "rules", "run", issues, "--rule", rule, "--start-step", "3", "--end-step", "6", pythonpath=str(rule_modules)
    )
    assert ranged.returncode == 0, ranged.stdout + ranged.stderr

    # a rule that could not evaluate: exit 4 (not 0), shown as such; 0 when allowed; an issue
    # found by another rule still wins (1)
    unsaved = "tests.rules.rules_not_evaluated:NeedsAnUnsavedTensor"
    blind = _cli("rules", "run", healthy, "--rule", unsaved, "--rule", rule, pythonpath=str(rule_modules))
    assert blind.returncode == 4, blind.stdout + blind.stderr
    assert "not evaluated (Error): the tensor 'never_saved' is not in this run" in blind.stdout
    assert "NotEvaluated" in blind.stdout and "not evaluated: NeedsAnUnsavedTensor" in blind.stdout
    allowed = _cli("rules", "run", healthy, "--rule", unsaved, "--allow-not-evaluated", pythonpath=str(rule_modules))
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    both = _cli("rules", "run", issues, "--rule", unsaved, "--rule", rule, pythonpath=str(rule_modules))
    assert both.returncode == 1, both.stdout + both.stderr

    unknown = _cli("rules", "run", healthy, "--rule", "VanishingGradeint")
    assert unknown.returncode == 2
    assert "unknown rule 'VanishingGradeint'" in unknown.stderr and "VanishingGradient" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    missing_path = _cli("rules", "run", str(tmp_path / "nothing"), "--rule", "VanishingGradient")
    assert missing_path.returncode == 2 and "no such file or directory" in missing_path.stderr  # at once
    assert not (tmp_path / "nothing").exists()
    (tmp_path / "empty").mkdir()
    missing_run = _cli("rules", "run", str(tmp_path / "empty"), "--rule", "VanishingGradient", "--wait-timeout", "0.3")
    assert missing_run.returncode == 2 and "did not appear" in missing_run.stdout
    assert "waiting for the first step in" in missing_run.stderr


def test_cli_rules_run_names_two_configurations_of_one_rule(tmp_path: Path, rule_modules: Path) -> None:
    issues = write_run(tmp_path / "issues", _gradients({2}))
    rule = "smd_style_rules:CustomGradientRule"
    two = _cli("rules", "run", issues, "--json", "--rule", f"{rule}:name=low,threshold=20",
               "--rule", f"{rule}:name=high,threshold=1e9", pythonpath=str(rule_modules))  # fmt: skip
    assert two.returncode == 1, two.stderr
    final = {line["configuration_name"]: line["status"] for line in map(json.loads, two.stdout.splitlines())
             if line.get("configuration_name") and line.get("status") not in (None, "InProgress")}  # fmt: skip
    assert final == {"low": "IssuesFound", "high": "NoIssuesFound"}
    same = _cli("rules", "run", issues, "--rule", f"{rule}:name=a,threshold=1", "--rule", f"{rule}:name=a,threshold=2",
                pythonpath=str(rule_modules))  # fmt: skip
    assert same.returncode == 2 and "two configurations are named 'a'" in same.stderr, same.stderr
    assert RuleSpec.parse("ExplodingTensor:name=x,only_nan=True") == RuleSpec(
        "ExplodingTensor", {"only_nan": "True"}, configuration_name="x"
    )


def test_cli_describe(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["rules", "describe", "vanishinggradient"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("VanishingGradient  [debugger]")
    assert "collections it needs saved: gradients" in text and "threshold = 1e-07" in text
    # when it may stop training, both semantics, and a fix hint per framework (from the class)
    from trainguard.rules import builtin_rules

    cls = builtin_rules()["VanishingGradient"]
    assert f"stop policy: {cls.stop_policy}" in text and "act only on certain findings" in text
    assert "semantics (parameter 'semantics', default 'calibrated'):" in text
    assert "  calibrated: " in text and "  sagemaker: SageMaker's documented single-step condition" in text
    for framework, hint in cls.fix_hints.items():
        assert f"  {framework}: {hint}" in text
    assert cli_main(["rules", "describe", "Nope"]) == 2
    assert "unknown rule 'Nope'" in capsys.readouterr().err


def test_smdebug_style_rule_describe(rule_modules: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["rules", "describe", "smd_style_rules:CustomGradientRule"]) == 0
    text = capsys.readouterr().out
    assert "threshold = 10.0" in text and "skip_step = -1" in text
    assert "Fires when the mean |gradient|" in text
