"""The summary tells the truth about how a run ended, and the README's sample output is real.

Three real small runs under ``trainguard run``: the README's own main example (stopped by a
rule), a script that crashes, and one that completes. Each "finished" line must say which, both
where ``trainguard run`` prints it and in ``trainguard summary RUN`` afterwards. The stopped run is
also the README's sample (``scripts/readme_samples.py``), its live finding line must name the
worker, and the rules that cannot apply to a PyTorch MLP regression (XGBoost, images, tokens,
tanh, validation) are counted in one line instead of listed as errors.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
# what a single-process PyTorch MLP regression without tanh, images, token ids or validation
# cannot be judged by
INAPPLICABLE_TO_THE_EXAMPLE = {
    "SaturatedActivation", "Overfit", "Overtraining", "CheckInputImages", "ClassImbalance", "NLPSequenceRatio",
    "TreeDepth", "FeatureImportanceOverweight", "ReplicaDivergence",
}  # fmt: skip


def _samples() -> ModuleType:
    spec = importlib.util.spec_from_file_location("readme_samples", REPO / "scripts" / "readme_samples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cli(*args: str, cwd: Path = REPO, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def _finished_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith("  finished    : ")]
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int, Path]:
    """The README's main example, run as the README says (output, exit status, run directory)."""
    samples = _samples()
    run = tmp_path_factory.mktemp("readme") / "run"
    command = samples.readme_command(samples.README.read_text(encoding="utf-8"))
    output, code = samples.run_example(command, run)
    return output, code, run


def test_readme_sample_output_is_the_real_output(example: tuple[str, int, Path]) -> None:
    output, code, _ = example
    samples = _samples()
    assert code == 3, output
    assert samples.problems(samples.README.read_text(encoding="utf-8"), output) == []


def test_a_run_stopped_by_a_rule_says_so(example: tuple[str, int, Path]) -> None:
    output, _, run = example
    assert _finished_line(output) == "  finished    : no: stopped by ExplodingTensor at step 4"
    # the live line names the worker the finding is on
    assert re.search(r"^trainguard: rule ExplodingTensor found an issue at step 4 on worker_0: ", output, re.M), output
    again = _cli("summary", str(run))
    assert again.returncode == 0, again.stderr
    assert _finished_line(again.stdout) == "  finished    : no: stopped by ExplodingTensor at step 4"


def test_rules_that_cannot_apply_are_one_line_not_errors(example: tuple[str, int, Path]) -> None:
    output, _, run = example
    line = next(line for line in output.splitlines() if "not applicable to this run:" in line)
    count, names = re.match(r"^    (\d+) rules not applicable to this run: (.*)$", line).groups()  # type: ignore[union-attr]
    assert set(names.split(", ")) == INAPPLICABLE_TO_THE_EXAMPLE and int(count) == len(INAPPLICABLE_TO_THE_EXAMPLE)
    for name in INAPPLICABLE_TO_THE_EXAMPLE:
        assert not re.search(rf"^    {name} +not evaluated", output, re.M), output
        # SageMaker's status is unchanged; the structured flag says "does not apply"
        document = json.loads((run / "rule-output" / f"{name}.json").read_text())
        assert document["status"] == "Error" and document["status_details"].startswith("RuleNotEvaluated: ")
        assert document["not_applicable"] is True
    for name in ("ExplodingTensor", "DeadRelu", "VanishingGradient"):  # these did judge the run
        assert json.loads((run / "rule-output" / f"{name}.json").read_text())["not_applicable"] is False


_CRASHING = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(60):
    if step == 30:
        for group in optimizer.param_groups:
            group["lr"] = 1e12  # diverges: ExplodingTensor has something to find offline
    x = torch.randn(32, 8)
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
raise RuntimeError("the data loader died")
"""

_HEALTHY = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(256, 8)
y = x.sum(1, keepdim=True)
for step in range(80):
    batch = slice(32 * (step % 8), 32 * (step % 8 + 1))
    loss = ((model(x[batch]) - y[batch]) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_crashed_script_says_it_crashed_and_rules_run_prints_the_finding(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent(_CRASHING))
    run = tmp_path / "run"
    done = _cli("run", "--out", str(run), "--save-interval", "5", "--", sys.executable, str(script))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the data loader died" in done.stderr
    assert _finished_line(done.stdout) == "  finished    : no: crashed (exit status 1)"
    again = _cli("summary", str(run))
    assert _finished_line(again.stdout) == "  finished    : no: crashed (exit status 1)"

    # rules run prints the finding itself (step, worker, message, fix), not RuleEvaluationConditionMet
    judged = _cli("rules", "run", str(run), "--rule", "ExplodingTensor")
    assert judged.returncode == 1, judged.stdout + judged.stderr
    table = judged.stdout[judged.stdout.index("trainguard rules: final status") :]
    assert "RuleEvaluationConditionMet" not in table, table
    found = re.search(r"^  ExplodingTensor  IssuesFound   step (\d+) on worker_0: .*NaN/inf", table, re.M)
    assert found and int(found.group(1)) >= 30, table
    assert re.search(r"^ +fix: lower the learning rate", table, re.M), table
    # without --rule: the default set; what cannot apply is one line, not "not evaluated" lines
    default = _cli("rules", "run", str(run))
    table = default.stdout[default.stdout.index("trainguard rules: final status") :]
    line = next(line for line in table.splitlines() if "not applicable to this run:" in line)
    assert {"TreeDepth", "CheckInputImages", "ReplicaDivergence"} <= set(line.split(": ", 1)[1].split(", "))
    assert not re.search(r"not evaluated: (TreeDepth|CheckInputImages|ReplicaDivergence):", table), table
    assert not re.search(r"^  (TreeDepth|CheckInputImages) ", table, re.M), table


def test_a_completed_run_says_finished_and_counts_what_does_not_apply(tmp_path: Path) -> None:
    script = tmp_path / "healthy.py"
    script.write_text(textwrap.dedent(_HEALTHY))
    done = _cli("run", "--out", str(tmp_path / "run"), "--rules", "--", sys.executable, str(script))
    assert done.returncode == 0, done.stdout + done.stderr
    assert _finished_line(done.stdout) == "  finished    : yes"
    line = next(line for line in done.stdout.splitlines() if "not applicable to this run:" in line)
    names = set(line.split(": ", 1)[1].split(", "))
    # a model with tanh is judged by SaturatedActivation; XGBoost rules and images still do not apply
    assert "SaturatedActivation" not in names and re.search(r"^    SaturatedActivation +\S", done.stdout, re.M)
    assert {"TreeDepth", "FeatureImportanceOverweight", "CheckInputImages", "NLPSequenceRatio"} <= names
    assert "not evaluated (Error): applies to" not in done.stdout
