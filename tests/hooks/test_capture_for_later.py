"""Capture for later (issue 43 item 8): ``trainguard run`` without ``--rules`` saves what the
default rules read, so that ``trainguard rules run RUN`` judges the run afterwards instead of
saying "not evaluated" for SaturatedActivation, NotNormalizedData and ClassImbalance."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from trainguard.rules import builtin_rules
from trainguard.rules.defaults import DEFAULT_RULE_COLLECTIONS, default_rule_specs, rule_collections
from trainguard.trials import create_trial

# A plain classifier with a tanh layer and a ReLU: no trainguard in it.
SCRIPT = textwrap.dedent(
    """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(512, 6)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    for step in range(80):  # 8 saved steps of 32 samples: more than NotNormalizedData's 100
        batch = slice(32 * step % 512, 32 * step % 512 + 32)
        loss = F.cross_entropy(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """
)
LATER_RULES = ("SaturatedActivation", "NotNormalizedData", "ClassImbalance")


def test_the_spelt_out_collections_are_what_the_default_rules_read() -> None:
    available = builtin_rules()
    classes = [available[spec.rule] for spec in default_rule_specs()]
    assert sorted(DEFAULT_RULE_COLLECTIONS) == sorted(rule_collections(classes))


def _trainguard(*words: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", *words], capture_output=True, text=True, timeout=600, cwd=cwd
    )


def test_a_run_captured_without_rules_is_judged_later(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run = tmp_path / "run"
    done = _trainguard(
        "run", "--out", str(run), "--overhead-budget", "0", "--", sys.executable, str(script), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    trial = create_trial(str(run))
    for collection in ("tanh_input", "relu_input", "model_inputs", "labels", "predictions"):
        assert trial.tensor_names(collection=collection), collection
    words = ["rules", "run", str(run), "--output-dir", str(tmp_path / "rules")]
    for rule in LATER_RULES:
        words += ["--rule", rule]
    judged = _trainguard(*words, cwd=tmp_path)
    # 4 is "a rule could not evaluate the run"; 0/1 are verdicts
    assert judged.returncode in (0, 1), judged.stdout + judged.stderr
    assert "not evaluated" not in judged.stdout, judged.stdout


def test_an_explicit_config_is_kept_as_given(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    config = tmp_path / "hook.json"
    config.write_text(
        '{"HookParameters": {"save_interval": "10"}, "CollectionConfigurations": [{"CollectionName": "losses"}]}'
    )
    run = tmp_path / "run"
    done = _trainguard(
        "run", "--out", str(run), "--config", str(config), "--", sys.executable, str(script), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    trial = create_trial(str(run))
    assert not trial.tensor_names(collection="tanh_input")
    assert trial.tensor_names(collection="losses")
