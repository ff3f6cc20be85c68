"""infra/build_app_wheel.sh (the trainguard wheel every stack image installs) builds with a Python
that has neither the `wheel` package nor a setuptools that can build wheels without it: a fresh
venv (ensurepip's pip and setuptools 65, no `wheel`). pip's build isolation brings the backend.
Needs the package index pip is configured with (as `pip install -e .` does)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_the_app_wheel_builds_without_the_wheel_package(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import wheel"], capture_output=True).returncode != 0
    out = tmp_path / "wheels"
    result = subprocess.run(
        ["bash", "infra/build_app_wheel.sh", str(out)], cwd=REPO, env={**os.environ, "PYTHON": str(python)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = out.glob("trainguard-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"trainguard/cli.py", "trainguard/services/uploader/uploader.py"} <= names
