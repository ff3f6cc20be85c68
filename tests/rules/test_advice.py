"""Advice: findings about the data or the initialisation are reported apart from issues.

They never make a rule IssuesFound, never stop training, never are the primary finding, and are
promoted to candidate causes only once the run shows a learning symptom (trainguard.rules.advice).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.rules.synthetic import write_run
from trainguard.rules import Param, Rule, RuleSpec, RuleStatus
from trainguard.rules.advice import ADVISING_RULES
from trainguard.rules.autostop import stop_record
from trainguard.rules.builtin.class_imbalance import ClassImbalance
from trainguard.rules.builtin.not_normalized_data import NotNormalizedData
from trainguard.rules.builtin.poor_weight_initialization import PoorWeightInitialization
from trainguard.rules.diagnosis import diagnose, render_diagnosis, role_of
from trainguard.rules.runner import RuleRunner, StatusUpdate
from trainguard.summary import render_rule_results

HERE = "tests.rules.test_advice"
REPO = Path(__file__).resolve().parents[2]


class InputScale(Rule):
    """Advises when tensor ``w`` is larger than ``threshold`` (a data property, by ``advises``)."""

    rule_name = "InputScale"
    advises = True
    threshold = Param(float, 1.0, "limit for max(w)")

    def check(self, step: int):
        value = float(np.max(self.base_trial.tensor("w").value(step)))
        if value > self.threshold:
            return self.issue(step, f"max(w) = {value:g}", fix_hint="scale w")
        return self.no_issue(step)


class UnscaledInputs(InputScale):
    """The same, under the name whose kind the explanation graph knows."""

    rule_name = "NotNormalizedData"


class LossStalls(Rule):
    """A learning symptom: fires (certain) from step ``at`` on."""

    rule_name = "LossNotDecreasing"  # the kind the diagnosis knows as a learning symptom
    at = Param(int, 5)

    def check(self, step: int):
        if step >= self.at:
            return self.issue(step, "loss did not decrease", fix_hint="fix the learning", certain=True)
        return self.no_issue(step)


def _bare(rule_class: type[Rule]) -> Rule:
    rule = rule_class.__new__(rule_class)
    rule.base_trial = None
    return rule


def _spec(rule: str, name: str = "", **parameters) -> RuleSpec:
    return RuleSpec(f"{HERE}:{rule}", {k: str(v) for k, v in parameters.items()}, name)


def _finding(rule: str, step: int, message: str, *, certain: bool = False, advice: bool = False) -> dict:
    return {"rule": rule, "step": step, "fired": True, "message": message, "fix_hint": f"fix {rule}",
            "certain": certain, "advice": advice, "worker": "worker_0"}  # fmt: skip


def _result(rule: str, *findings: dict) -> dict:
    status = "IssuesFound" if any(not f["advice"] for f in findings) else "NoIssuesFound"
    return {"configuration_name": rule, "rule": rule, "status": status, "findings": list(findings)}


# -- which findings advise -------------------------------------------------------------------------
def test_data_and_init_properties_are_advice_symptoms_and_certain_findings_are_not() -> None:
    assert {"NotNormalizedData", "CheckInputImages", "ClassImbalance", "NLPSequenceRatio",
            "PoorWeightInitialization", "TreeDepth", "FeatureImportanceOverweight"} <= set(ADVISING_RULES)  # fmt: skip
    scale = _bare(NotNormalizedData).issue(0, "model input std 9.1 (features not normalised)")
    assert scale.advice and not scale.certain and scale.to_dict()["advice"] is True
    # NaN in the data is not a property to advise on: kind NonFinite
    assert not _bare(NotNormalizedData).issue(0, "model input holds NaN").advice
    # ClassImbalance's misprediction finding is a symptom (kind Misprediction), its imbalance is advice
    assert _bare(ClassImbalance).issue(100, "class 3 has 40x fewer labels than class 0").advice
    assert not _bare(ClassImbalance).issue(100, "class 3 is mispredicted 97% of the time").advice
    # a certain initialisation finding (identical weights) is an issue, not advice
    assert not _bare(PoorWeightInitialization).issue(0, "all weights identical", certain=True).advice
    assert _bare(PoorWeightInitialization).issue(0, "activation variance ratio 1e4").advice
    # a rule outside the list reports issues; any rule may mark one result as advice, never certain
    plain = _bare(LossStalls)
    assert not plain.issue(3, "stalled").advice
    marked = plain.issue(3, "labels look shuffled", advice=True, certain=True)
    assert marked.advice and not marked.certain
    # the class attribute of a custom rule, and the round trip of the runner's JSON lines
    custom = _bare(InputScale).issue(1, "max(w) = 5")
    assert custom.advice and not custom.certain
    assert not _bare(InputScale).issue(1, "w is constant", certain=True).advice
    update = StatusUpdate("c", "InputScale", RuleStatus.IN_PROGRESS, result=custom)
    assert StatusUpdate.from_dict(json.loads(json.dumps(update.to_dict()))).result.advice is True


# -- the diagnosis ---------------------------------------------------------------------------------
def test_advice_alone_is_no_issue_and_never_the_primary() -> None:
    results = [
        _result("NotNormalizedData", _finding("NotNormalizedData", 0, "input std 9", advice=True)),
        _result("ClassImbalance", _finding("ClassImbalance", 100, "class 1 is 20x rarer", advice=True)),
    ]
    diagnosis = diagnose(results)
    assert diagnosis["primary"] == [] and diagnosis["consequences"] == [] and diagnosis["other"] == []
    assert [f["rule"] for f in diagnosis["advice"]] == ["NotNormalizedData", "ClassImbalance"]
    assert all(f["advice"] is True for f in diagnosis["advice"])
    assert role_of(diagnosis, "NotNormalizedData") == "advice"
    lines = render_diagnosis(diagnosis)
    assert not any("diagnosis   :" in line for line in lines)
    assert any(line.startswith("  advice      : NotNormalizedData at step 0") for line in lines)
    # an issue that is no learning symptom (validation overfitting) does not promote advice either
    results.append(_result("Overfit", _finding("Overfit", 200, "validation loss 30% above training")))
    diagnosis = diagnose(results)
    assert [f["rule"] for f in diagnosis["primary"]] == ["Overfit"]
    assert [f["rule"] for f in diagnosis["advice"]] == ["NotNormalizedData", "ClassImbalance"]


def test_a_learning_symptom_promotes_advice_to_a_possible_cause_beside_the_primary() -> None:
    results = [
        _result("NotNormalizedData", _finding("NotNormalizedData", 0, "input std 40", advice=True)),
        _result("PoorWeightInitialization", _finding("PoorWeightInitialization", 0, "variance ratio 1e3", advice=True)),
        _result("SaturatedActivation", _finding("SaturatedActivation", 30, "90% of tanh saturated", certain=True)),
    ]  # fmt: skip
    diagnosis = diagnose(results)
    # advice came first and explains the symptom, yet the symptom's own finding leads
    assert [f["rule"] for f in diagnosis["primary"]] == ["SaturatedActivation"]
    causes = {f["rule"]: f for f in diagnosis["possible_causes"]}
    assert set(causes) == {"NotNormalizedData", "PoorWeightInitialization"}
    assert causes["NotNormalizedData"]["explains"] == "SaturatedActivation" and causes["NotNormalizedData"]["promoted"]
    assert "unscaled inputs" in causes["NotNormalizedData"]["why"]
    assert diagnosis["advice"] == []
    assert role_of(diagnosis, "NotNormalizedData") == "possible_cause"
    text = "\n".join(render_diagnosis(diagnosis))
    assert text.index("diagnosis   : SaturatedActivation") < text.index("possible cause: NotNormalizedData")
    # promoted advice the graph cannot link to the symptom is another finding
    results.append(_result("NLPSequenceRatio", _finding("NLPSequenceRatio", 0, "62% padding tokens", advice=True)))
    other = diagnose(results)["other"]
    assert [(f["rule"], f["promoted"]) for f in other] == [("NLPSequenceRatio", True)]


def test_the_primary_is_the_cause_of_the_earliest_certain_finding_not_the_finding() -> None:
    # a learning rate far too high: update ratios first (not certain), saturation certain later
    results = [
        _result("WeightUpdateRatio", _finding("WeightUpdateRatio", 20, "update 1827 times its norm")),
        _result("VanishingGradient", _finding("VanishingGradient", 30, "5 of 6 gradients vanished", certain=True)),
        _result("SaturatedActivation", _finding("SaturatedActivation", 30, "saturated"),
                _finding("SaturatedActivation", 50, "saturated", certain=True)),
    ]  # fmt: skip
    diagnosis = diagnose(results)
    assert [f["rule"] for f in diagnosis["primary"]] == ["WeightUpdateRatio"]
    assert {f["rule"] for f in diagnosis["consequences"]} == {"VanishingGradient", "SaturatedActivation"}
    # an uncertain independent finding earlier than the certain one does not lead
    results.append(_result("TensorVariance", _finding("TensorVariance", 0, "variance of w below 1e-9")))
    diagnosis = diagnose(results)
    assert [f["rule"] for f in diagnosis["primary"]] == ["WeightUpdateRatio"]
    assert [f["rule"] for f in diagnosis["other"]] == ["TensorVariance"]


# -- statuses, files and exit codes of a real runner -----------------------------------------------
def _values(large_at: set[int]) -> dict[int, dict[str, np.ndarray]]:
    return {s: {"w": np.full(3, 5.0 if s in large_at else 0.5, dtype=np.float32)} for s in range(10)}


def test_a_rule_that_only_advises_ends_no_issues_found_with_advice_details(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", _values({2, 3}))
    updates: list[StatusUpdate] = []
    final = RuleRunner(run, [_spec("InputScale", "scale")], on_update=updates.append, poll_interval=0.05).run()
    assert final["scale"].status == RuleStatus.NO_ISSUES_FOUND
    assert final["scale"].status_details.startswith("Advice: InputScale at step 2: max(w) = 5")
    # the live updates carry the advice and never say IssuesFound
    advised = [u for u in updates if u.result is not None and u.result.fired]
    assert [u.result.step for u in advised] == [2, 3] and all(u.result.advice for u in advised)
    assert RuleStatus.ISSUES_FOUND not in {u.status for u in updates}
    document = json.loads((tmp_path / "run" / "rule-output" / "scale.json").read_text())
    assert document["status"] == "NoIssuesFound" and [f["advice"] for f in document["findings"]] == [True, True]
    assert document["diagnosis"]["primary"] == [] and document["diagnosis"]["this_rule"] == "advice"
    summary = render_rule_results([document])
    assert "1 run, 0 found issues, 1 gave advice" in summary
    assert "scale  NoIssuesFound, advice at step 2: max(w) = 5" in summary


def test_advice_with_a_learning_symptom_is_a_possible_cause_and_the_symptom_an_issue(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", _values({0, 1}))
    final = RuleRunner(run, [_spec("UnscaledInputs", "scale"), _spec("LossStalls", "loss", at=6)]).run()
    assert final["scale"].status == RuleStatus.NO_ISSUES_FOUND and final["loss"].status == RuleStatus.ISSUES_FOUND
    document = json.loads((tmp_path / "run" / "rule-output" / "scale.json").read_text())
    assert document["diagnosis"]["this_rule"] == "possible_cause"
    assert [f["rule"] for f in document["diagnosis"]["primary"]] == ["LossNotDecreasing"]
    (cause,) = document["diagnosis"]["possible_causes"]
    assert (cause["rule"], cause["step"], cause["explains"]) == ("NotNormalizedData", 0, "LossNotDecreasing")


def _rules_run(run: str, *rules: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "trainguard.cli", "rules", "run", run, "--json", "--wait-timeout", "5"]
    for rule in rules:
        command += ["--rule", rule]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_rules_run_exits_no_issues_on_advice_and_its_json_says_advice(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", _values({4}))
    result = _rules_run(run, f"{HERE}:InputScale")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    findings = [line["result"] for line in lines if line.get("result") and line["result"]["fired"]]
    assert [(f["step"], f["advice"], f["certain"]) for f in findings] == [(4, True, False)]
    diagnosis = lines[-1]["diagnosis"]
    assert diagnosis["primary"] == [] and [f["advice"] for f in diagnosis["advice"]] == [True]
    # the same capture with a learning symptom: issues found
    result = _rules_run(run, f"{HERE}:InputScale", f"{HERE}:LossStalls:at=8")
    assert result.returncode == 1, result.stdout + result.stderr


# -- the stop record -------------------------------------------------------------------------------
def test_the_stop_record_names_the_primary_and_the_trigger_apart() -> None:
    primary = {"configuration_name": "WeightUpdateRatio", "rule": "WeightUpdateRatio", "step": 20,
               "message": "update 1827 times its norm", "fix_hint": "lower the learning rate", "certain": False,
               "worker": "worker_0"}  # fmt: skip
    trigger = {"configuration_name": "SaturatedActivation", "rule": "SaturatedActivation", "step": 50,
               "message": "saturated", "fix_hint": "use ReLU", "certain": True, "worker": "worker_0"}  # fmt: skip
    record = stop_record(primary, trigger, 1.0, 1.1, 1.2, 1.5)
    assert (record["configuration_name"], record["fix_hint"], record["primary_step"]) == (
        "WeightUpdateRatio", "lower the learning rate", 20
    )  # fmt: skip
    assert record["step"] == 50 and record["certain"] is True and record["primary_certain"] is False
    assert record["triggered_by"]["configuration_name"] == "SaturatedActivation"
    summary = render_rule_results([_result("WeightUpdateRatio", _finding("WeightUpdateRatio", 20, "x"))], record)
    assert ("training was stopped by WeightUpdateRatio at step 50 (the diagnosis; triggered by "
            "SaturatedActivation's certain finding), 0.5 s after the finding") in summary  # fmt: skip


def test_rules_describe_and_list_say_which_rules_advise() -> None:
    def cli(*args: str) -> str:
        result = subprocess.run([sys.executable, "-m", "trainguard.cli", "rules", *args], cwd=REPO,
                                capture_output=True, text=True, timeout=300)  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout

    described = cli("describe", "NotNormalizedData")
    assert "advice: yes" in described and "NoIssuesFound" in described and "learning symptom" in described
    assert "LossNotDecreasing" in described.split("advice: yes", 1)[1]
    assert "advice: no" in cli("describe", "ExplodingTensor")
    listed = {item["name"]: item["advises"] for item in json.loads(cli("list", "--json"))}
    assert {name for name, advises in listed.items() if advises} == set(ADVISING_RULES)


def test_rules_run_prints_advice_as_advice(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", _values({4, 6}))
    command = [sys.executable, "-m", "trainguard.cli", "rules", "run", run, "--wait-timeout", "5", "--rule",
               f"{HERE}:InputScale"]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"trainguard rules: {HERE}:InputScale: advice at step 4 on worker_0: max(w) = 5" in result.stdout
    assert f"{HERE}:InputScale: also advises at step 6" in result.stdout
    assert "advice      : InputScale at step 4" in result.stdout
    assert "NoIssuesFound Advice: InputScale at step 4" in result.stdout
    assert "IssuesFound" not in result.stdout.replace("NoIssuesFound", "")


def test_the_watch_never_stops_training_on_advice(tmp_path: Path) -> None:
    from trainguard.rules.autostop import RuleWatch
    from trainguard.rules.base import StepResult

    lines: list[str] = []
    watch = RuleWatch(str(tmp_path), [RuleSpec("NotNormalizedData", {}, "data", ({"name": "stoptraining"},))],
                      echo=lines.append)  # fmt: skip
    training = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], process_group=0)
    try:
        watch.attach(training)
        advice = StepResult("NotNormalizedData", 3, True, "input std 40", advice=True)
        watch._on_finding(StatusUpdate("data", "NotNormalizedData", RuleStatus.IN_PROGRESS, result=advice))
        assert watch._stopper is None and training.poll() is None
        assert lines == ["trainguard: rule data advises at step 3: input std 40"]
        # the same finding as an issue, certain, does stop it (the watch is armed)
        issue = StepResult("NotNormalizedData", 4, True, "input holds NaN", certain=True)
        watch._on_finding(StatusUpdate("data", "NotNormalizedData", RuleStatus.ISSUES_FOUND, result=issue))
        assert watch._stopper is not None
        watch._stopper.join(timeout=60)
        assert training.poll() is not None and watch.stop_record["triggered_by"]["step"] == 4
    finally:
        if training.poll() is None:
            training.kill()
        training.wait()
