"""A script with a ``trainguard.pytorch.Hook`` of its own, run under ``trainguard run`` (zero-code
capture armed): into the run's directory the script's hook alone writes (two hooks wrote the
same step files over each other, each with its own schedule); into another one both capture. An
smdebug script's ``create_from_json_file()`` there takes the run's own capture config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from trainguard.trials import create_trial

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys, torch
from torch import nn
import trainguard.pytorch as tg
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
hook = {hook}
hook.register_module(net)
optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
for step in range({steps}):
    optimizer.zero_grad()
    x = torch.randn(16, 8)
    nn.functional.mse_loss(net(x), x[:, :1]).backward()
    optimizer.step()
"""
OWN_HOOK = SCRIPT.format(hook="tg.Hook(sys.argv[1], save_config=tg.SaveConfig(save_interval=4))", steps=25)


def _run(tmp_path: Path, out: Path, hook_dir: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(OWN_HOOK)
    command = [sys.executable, "-m", "trainguard", "run", "--out", str(out), "--", sys.executable, str(script),
               str(hook_dir)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def test_the_scripts_hook_into_the_run_directory_makes_the_run(tmp_path):
    out = tmp_path / "run"
    done = _run(tmp_path, out, out)
    assert "zero-code capture stands aside" in done.stdout + done.stderr
    trial = create_trial(str(out), collection_wait_timeout=0)
    assert trial.steps() == [0, 4, 8, 12, 16, 20, 24]  # its schedule alone (zero-code's is every 10)
    assert trial.workers() == ["worker_0"]
    weight = trial.tensor_names(collection="weights")[0]
    assert trial.tensor(weight).steps() == [0, 4, 8, 12, 16, 20, 24]


def test_the_scripts_hook_elsewhere_captures_beside_zero_code(tmp_path):
    out, own = tmp_path / "run", tmp_path / "own"
    done = _run(tmp_path, out, own)
    assert "stands aside" not in done.stdout + done.stderr
    assert create_trial(str(own), collection_wait_timeout=0).steps() == [0, 4, 8, 12, 16, 20, 24]
    assert create_trial(str(out), collection_wait_timeout=0).steps() == [0, 10, 20]


# an smdebug script, its import changed only
FROM_JSON_SCRIPT = SCRIPT.format(hook="tg.Hook.create_from_json_file()", steps=10)

def test_create_from_json_file_under_trainguard_run_takes_the_runs_capture(tmp_path):
    # no debughookconfig.json anywhere: the run's own config (its --out, schedule, the rules'
    # collections) builds the script's hook, which makes the run
    script = tmp_path / "train.py"
    script.write_text(FROM_JSON_SCRIPT)
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "trainguard", "run", "--out", str(out), "--rules", "--save-interval", "3", "--",
         sys.executable, str(script)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "zero-code capture stands aside" in done.stdout + done.stderr
    trial = create_trial(str(out), collection_wait_timeout=0)
    assert trial.steps() == [0, 3, 6, 9]
    assert trial.tensor_names(collection="relu_output")  # DeadRelu's collection, from --rules


def test_create_from_json_file_outside_a_run_still_needs_a_config(tmp_path, monkeypatch):
    import pytest

    import trainguard.pytorch as tg
    from trainguard.config.capture_config import CAPTURE_VARIABLE
    from trainguard.errors import ConfigError

    for name in (CAPTURE_VARIABLE, "SMDEBUG_CONFIG_FILE_PATH", "TRAINGUARD_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="debughookconfig.json"):
        tg.Hook.create_from_json_file()
