"""`trainguard run` starts training without loading what only later steps need.

Every module the CLI imports before it starts the command delays training by its import time
(numpy, the protobuf codec and the other verbs' modules came to ~0.25 s here), and the summary
it prints at the end must not add its own imports after training ended.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_SRC = Path(__file__).resolve().parents[2] / "src"
ENVIRONMENT = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_SRC)}

# What `trainguard run` had loaded when it started the training command
_SPY = textwrap.dedent(
    """
    import subprocess, sys
    seen = {}
    original = subprocess.Popen.__init__
    def spy(self, *args, **kwargs):
        if not seen:
            seen.update(dict.fromkeys(sys.modules))
        original(self, *args, **kwargs)
    subprocess.Popen.__init__ = spy
    from trainguard.cli import main
    status = main(sys.argv[1:])
    for name in sorted(seen):
        print("LOADED", name)
    sys.exit(status)
    """
)


def _loaded_before_training(tmp_path: Path, *options: str) -> set[str]:
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", _SPY, "run", "--out", str(out), *options, "--", sys.executable, "-c", "pass"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=ENVIRONMENT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("LOADED ")}


def _trainguard(cwd: Path, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainguard.cli", *words], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=ENVIRONMENT)  # fmt: skip


def test_run_starts_the_command_before_loading_numpy_protobuf_or_other_verbs(tmp_path: Path) -> None:
    loaded = _loaded_before_training(tmp_path)
    assert "trainguard.zero_code" in loaded  # the configuration was checked before the start
    assert "trainguard.hooks.base" in loaded
    for module in ("numpy", "google.protobuf", "trainguard.format.tensor_codec", "trainguard.writer.thread",
                   "trainguard.commands.submit", "trainguard.rules.runner", "trainguard.trial"):  # fmt: skip
        assert module not in loaded, f"{module} loaded before training starts"


def test_run_with_rules_still_checks_them_before_the_start(tmp_path: Path) -> None:
    loaded = _loaded_before_training(tmp_path, "--rules", "LossNotDecreasing", "--allow-not-evaluated")
    assert "trainguard.rules.runner" in loaded


def test_a_bad_configuration_is_still_refused_before_the_start(tmp_path: Path) -> None:
    done = _trainguard(tmp_path, "run", "--out", str(tmp_path / "r"), "--save-interval", "0", "--",
                       sys.executable, "-c", "open('started', 'w')")  # fmt: skip
    assert done.returncode == 2
    assert "--save-interval 0" in done.stderr  # the option the user typed, not the variable it sets
    assert not (tmp_path / "started").exists()


def test_other_verbs_and_help_still_listed(tmp_path: Path) -> None:
    done = _trainguard(tmp_path, "--help")
    assert done.returncode == 0
    for verb in ("run", "summary", "rules", "report", "submit"):
        assert verb in done.stdout


@pytest.mark.parametrize("profile", [False, True])
def test_the_profiler_is_loaded_in_training_only_when_asked_for(tmp_path: Path, profile: bool) -> None:
    script = "import sys; print('PROFILER', 'trainguard.profiler' in sys.modules)"
    options = ["--profile"] if profile else []
    done = _trainguard(tmp_path, "run", "--out", str(tmp_path / "r"), *options, "--", sys.executable, "-c", script)
    assert done.returncode == 0, done.stderr
    assert f"PROFILER {profile}" in done.stdout


def test_the_format_package_still_offers_every_name_it_loads_on_use() -> None:
    import trainguard.format as package

    assert sorted(package.__all__) == sorted(package._HOME)
    for name in package.__all__:
        value = getattr(package, name)
        assert value.__module__.startswith("trainguard.format."), name
    with pytest.raises(AttributeError):
        package.not_a_name  # noqa: B018 - the attribute access is the test
