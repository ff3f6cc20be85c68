"""Auto-stop on one machine: ``trainguard run --rules --stop-on-issue`` with real training scripts.

The faulty example (learning rate far too high) must be detected and stopped long before it
would finish; the healthy example must complete with no findings. Both run through the real CLI
in a subprocess, with the rules in their own process following the capture live.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.cli import build_parser
from trainguard.commands.rules import parse_rule_list
from trainguard.errors import ConfigError
from trainguard.rules import Rule, RuleSpec
from trainguard.rules.defaults import DEFAULT_RULES, hook_config_for_rules, rule_collections
from trainguard.trial import create_trial

REPO = Path(__file__).resolve().parents[2]
HERE = "tests.rules.test_autostop"


class FiresFromStepTwo(Rule):
    """Fires on every saved step from step 2 on (drives the process-group test)."""

    rule_name = "FiresFromStepTwo"
    fix_hint = "none: a test rule"
    collections = ("losses",)

    def check(self, step: int):
        return self.issue(step, "step >= 2", certain=True) if step >= 2 else self.no_issue(step)


def _trainguard(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "trainguard.cli", *args], cwd=REPO, env=environment,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.mark.slow
def test_faulty_script_is_detected_and_stopped(tmp_path: Path) -> None:
    out = tmp_path / "run"
    started = time.time()
    result = _trainguard("run", "--out", str(out), "--rules", "--stop-on-issue", "--",
                         sys.executable, "examples/faulty/exploding_lr.py")  # fmt: skip
    assert result.returncode == 3, result.stdout + result.stderr
    record = json.loads((out / "trainguard-stop.json").read_text())
    assert record["configuration_name"] in DEFAULT_RULES
    assert record["stopped_at"] - record["finding_reported_at"] < 5, "stopped at once, not after the 10 s grace"
    trial = create_trial(str(out), collection_wait_timeout=0)
    # 30 epochs of 64 steps = 1920 steps: found within the first few saved steps, and stopped long
    # before the end. (How many steps run between the finding and the stop is the step rate times
    # the stop latency, bounded above in seconds: on a quiet machine, 200-460 of these ~1 ms steps.)
    assert not trial.training_ended
    assert max(trial.steps()) < 960 and record["step"] <= 20, (record, max(trial.steps()))
    assert time.time() - started < 120
    # the summary names the finding, its step and the fix
    assert f"training was stopped by {record['configuration_name']} at step {record['step']}" in result.stdout
    assert f"step {record['step']}: " in result.stdout and "fix: lower the learning rate" in result.stdout
    assert "found an issue at step" in result.stderr
    # the summary leads with one diagnosis: the stopping rule's certain finding, then its fix
    diagnosis = next(line for line in result.stdout.splitlines() if line.startswith("  diagnosis   : "))
    assert diagnosis.startswith(f"  diagnosis   : {record['configuration_name']} at step {record['step']}")
    assert "(not certain)" not in diagnosis and record["certain"] is True
    outputs = {p.stem: json.loads(p.read_text()) for p in (out / "rule-output").glob("*.json")}
    assert outputs[record["configuration_name"]]["status"] == "IssuesFound"
    # no rule crashed; a rule whose data never came before the stop (Overfit without validation
    # steps, SaturatedActivation without tanh/sigmoid) says it could not evaluate, not "no issues"
    errors = {name: doc["status_details"] for name, doc in outputs.items() if doc["status"] == "Error"}
    assert all(details.startswith("RuleNotEvaluated: ") for details in errors.values()), errors
    # later, trainguard summary reads the same from the run's rule-output files
    summary = _trainguard("summary", str(out))
    assert summary.returncode == 0, summary.stderr
    assert f"training was stopped by {record['configuration_name']} at step {record['step']}" in summary.stdout
    assert f"{record['configuration_name']}" in summary.stdout and "fix: lower the learning rate" in summary.stdout


@pytest.mark.slow
def test_healthy_script_completes_with_no_findings(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # No --allow-not-evaluated: rules of the implicit default set that cannot apply to this model
    # (no tanh/sigmoid for SaturatedActivation) are reported, but a healthy run still exits 0.
    result = _trainguard("run", "--out", str(out), "--rules", "--stop-on-issue", "--",
                         sys.executable, "examples/healthy/mnist_like_cnn.py",
                         "--epochs", "2", "--train-size", "1024")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "val accuracy" in result.stdout
    outputs = {p.stem: json.loads(p.read_text()) for p in (out / "rule-output").glob("*.json")}
    assert set(outputs) == set(DEFAULT_RULES)
    # no finding; a rule without its data (no tanh/sigmoid in this CNN) says so instead of "no issues"
    statuses = {name: (doc["status"], doc["status_details"]) for name, doc in outputs.items()}
    assert all(
        status == "NoIssuesFound" or (status == "Error" and details.startswith("RuleNotEvaluated: "))
        for status, details in statuses.values()
    ), statuses
    assert all(not doc["findings"] for doc in outputs.values())
    # ... and as a rule that does not apply to this model, counted in one line (not an error line)
    assert statuses["SaturatedActivation"][0] == "Error" and outputs["SaturatedActivation"]["not_applicable"]
    assert re.search(r"rules? not applicable to this run: .*SaturatedActivation", result.stdout), result.stdout
    assert f"rules       : {len(DEFAULT_RULES)} run, 0 found issues" in result.stdout
    assert not (out / "trainguard-stop.json").exists()
    trial = create_trial(str(out), collection_wait_timeout=0)
    assert trial.training_ended
    # the hook config given to the script included what the rules need (DeadRelu: relu_output)
    assert trial.tensor_names(collection="relu_output"), trial.collections().keys()
    assert outputs["DeadRelu"]["last_evaluated_step"] == max(trial.steps())


SCRIPT_IGNORING_SIGTERM = """
import signal, subprocess, sys, time
import torch

signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends this one
if sys.argv[1] != "-":  # a child of its own, in the same process group, also deaf to SIGTERM
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    open(sys.argv[1], "w").write(str(child.pid))
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(int(sys.argv[2])):
    loss = torch.nn.functional.mse_loss(model(torch.randn(8, 4)), torch.zeros(8, 1))
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    time.sleep(0.01)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in state


@pytest.mark.slow
def test_stop_kills_the_whole_process_group_after_the_grace_period(tmp_path: Path) -> None:
    script, pid_file = tmp_path / "train.py", tmp_path / "child.pid"
    script.write_text(SCRIPT_IGNORING_SIGTERM)
    out = tmp_path / "run"
    result = _trainguard("run", "--out", str(out), "--save-interval", "1", "--rules", f"{HERE}:FiresFromStepTwo",
                         "--stop-on-issue", "--stop-grace", "1",
                         "--", sys.executable, str(script), str(pid_file), "100000")  # fmt: skip
    assert result.returncode == 3, result.stdout + result.stderr
    record = json.loads((out / "trainguard-stop.json").read_text())
    assert record["step"] == 2
    assert 0.9 <= record["stopped_at"] - record["signalled_at"] < 5, "SIGTERM ignored: SIGKILL after the 1 s grace"
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild), "the script's own child was in the process group and got killed too"


def test_rules_without_stop_report_but_do_not_stop(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT_IGNORING_SIGTERM)
    out = tmp_path / "run"
    result = _trainguard("run", "--out", str(out), "--save-interval", "2", "--rules", f"{HERE}:FiresFromStepTwo",
                         "--", sys.executable, str(script), "-", "12")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert create_trial(str(out), collection_wait_timeout=0).training_ended
    document = json.loads((out / "rule-output" / f"{HERE}:FiresFromStepTwo.json").read_text())
    assert [f["step"] for f in document["findings"]] == [2, 4, 6, 8, 10]
    assert "5 finding(s), first at step 2" in result.stdout


class NeedsAMissingTensor(Rule):
    """Says at every step that it cannot evaluate (its tensor is never saved)."""

    rule_name = "NeedsAMissingTensor"
    collections = ("losses",)

    def check(self, step: int):
        return self.not_evaluated("the tensor 'never_saved' is not in this run", step)


def test_a_rule_that_could_not_evaluate_makes_run_exit_4(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT_IGNORING_SIGTERM)
    rules = f"{HERE}:NeedsAMissingTensor"
    result = _trainguard("run", "--out", str(tmp_path / "a"), "--save-interval", "2", "--rules", rules,
                         "--", sys.executable, str(script), "-", "6")  # fmt: skip
    assert result.returncode == 4, result.stdout + result.stderr
    assert "not evaluated (Error): the tensor 'never_saved' is not in this run" in result.stdout
    assert "0 found issues, 1 not evaluated" in result.stdout
    document = json.loads((tmp_path / "a" / "rule-output" / f"{rules}.json").read_text())
    assert document["status"] == "Error"
    assert document["status_details"] == "RuleNotEvaluated: the tensor 'never_saved' is not in this run"
    allowed = _trainguard("run", "--out", str(tmp_path / "b"), "--save-interval", "2", "--rules", rules,
                          "--allow-not-evaluated", "--", sys.executable, str(script), "-", "6")  # fmt: skip
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr


def test_profile_flags_reach_the_child(tmp_path: Path) -> None:
    probe = (
        "import os; e = os.environ; "
        "print('PROFILER', e.get('TRAINGUARD_PROFILER'), e.get('TRAINGUARD_PROFILER_INTERVAL_MS'))"
    )
    result = _trainguard("run", "--out", str(tmp_path / "a"), "--profile", "--", sys.executable, "-c", probe)
    assert "PROFILER 1 None" in result.stdout, result.stderr
    result = _trainguard(
        "run", "--out", str(tmp_path / "b"), "--profile-interval-ms", "200", "--", sys.executable, "-c", probe
    )
    assert "PROFILER 1 200" in result.stdout, result.stderr


def test_rule_list_syntax() -> None:
    specs = parse_rule_list("ExplodingTensor,VanishingGradient:threshold=1e-6,x=2,pkg.mod:Cls:a=1,Other")
    assert [(s.rule, dict(s.parameters)) for s in specs] == [
        ("ExplodingTensor", {}),
        ("VanishingGradient", {"threshold": "1e-6", "x": "2"}),
        ("pkg.mod:Cls", {"a": "1"}),
        ("Other", {}),
    ]
    with pytest.raises(ConfigError, match="comes before any rule name"):
        parse_rule_list("threshold=1,ExplodingTensor")


def test_run_flags_choose_rules_and_actions() -> None:
    from trainguard.launch.options import rule_specs

    def specs(*argv: str) -> list[RuleSpec]:
        args = build_parser().parse_args(["run", *argv, "--", "python", "x.py"])
        assert isinstance(args, argparse.Namespace)
        return rule_specs(args)

    assert specs() == []
    defaults = specs("--stop-on-issue")
    assert [s.rule for s in defaults] == [name for name in DEFAULT_RULES]
    assert all(s.actions == ({"name": "stoptraining"},) for s in defaults)
    chosen = specs("--rules", "VanishingGradient:threshold=1e-5", "--rules", "default")
    assert [s.rule for s in chosen][-len(DEFAULT_RULES) :] == list(DEFAULT_RULES)
    assert all(not s.actions for s in chosen)
    # a rule named after the defaults replaces the default configuration of that name
    override = specs("--rules", "--rules", "VanishingGradient:threshold=1e-5")
    assert len(override) == len(DEFAULT_RULES)
    assert dict(override[-1].parameters) == {"threshold": "1e-5"}


def test_hook_config_adds_rule_collections(tmp_path: Path) -> None:
    from trainguard.rules import builtin_rules

    classes = [builtin_rules()[name] for name in DEFAULT_RULES]
    needed = rule_collections(classes)
    assert {"gradients", "losses", "relu_output", "weights"} <= set(needed)
    document = hook_config_for_rules(needed, save_interval=5)
    assert document["HookParameters"] == {"save_interval": "5"}
    names = [entry["CollectionName"] for entry in document["CollectionConfigurations"]]
    assert names[:7] == ["weights", "biases", "gradients", "losses", "outputs", "scalars", "default"]
    assert "relu_output" in names and len(names) == len(set(names))
    user = tmp_path / "hook.json"
    gradients = {"CollectionName": "gradients", "CollectionParameters": {"save_interval": "7"}}
    user.write_text(json.dumps({"HookParameters": {"save_interval": "50"}, "CollectionConfigurations": [gradients]}))
    merged = hook_config_for_rules(["gradients", "relu_output"], base_config=user)
    assert merged["HookParameters"] == {"save_interval": "50"}
    assert merged["CollectionConfigurations"] == [
        {"CollectionName": "gradients", "CollectionParameters": {"save_interval": "7"}},
        {"CollectionName": "relu_output"},
    ]
    from trainguard.config.json_config import hook_kwargs_from_document

    kwargs = hook_kwargs_from_document(merged)
    assert "relu_output" in kwargs["include_collections"]
    assert kwargs["collection_manager"].get("gradients").save_config is not None


def test_bad_rules_fail_before_training(tmp_path: Path) -> None:
    result = _trainguard("run", "--out", str(tmp_path / "r"), "--rules", "NoSuchRule", "--",
                         sys.executable, "-c", "print('TRAINING RAN')")  # fmt: skip
    assert result.returncode == 2
    assert "unknown rule 'NoSuchRule'" in result.stderr and "TRAINING RAN" not in result.stdout


def _runner_priority(watch) -> tuple[int, int]:
    pid = watch._runner.pid
    return os.sched_getscheduler(pid), os.getpriority(os.PRIO_PROCESS, pid)


def test_the_rule_runner_of_trainguard_run_gives_way_to_training(tmp_path: Path, monkeypatch) -> None:
    """Batch scheduling at nice 5: behind training, ahead of the writer process (nice 10)."""
    from trainguard.rules.autostop import RuleWatch

    own = os.getpriority(os.PRIO_PROCESS, 0)
    specs = [RuleSpec.parse("LossNotDecreasing")]
    for variable, expected in (
        (None, min(19, own + RuleWatch.NICE)),
        ("0", own),
        ("-3", min(19, own + RuleWatch.NICE)),
    ):
        if variable is None:
            monkeypatch.delenv("TRAINGUARD_RULES_NICE", raising=False)
        else:
            monkeypatch.setenv("TRAINGUARD_RULES_NICE", variable)  # -3: not allowed, the default
        watch = RuleWatch(str(tmp_path / f"run-{variable}"), specs)
        watch.start()
        try:
            deadline = time.monotonic() + 60
            # the runner lowers its own priority as it starts: wait for it (its imports take ~1 s)
            while _runner_priority(watch) != (os.SCHED_BATCH, expected) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _runner_priority(watch) == (os.SCHED_BATCH, expected), variable
        finally:
            watch.training_finished(timeout=30)
