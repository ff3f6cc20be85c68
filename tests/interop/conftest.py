"""Fixtures for trainguard <-> smdebug 1.0.34 interoperability tests.

smdebug runs in its own cached venv (see smdebug_env.py) and is driven through the scripts in
smdebug_scripts/, never imported into the test process.

Fixtures:
  smdebug_python    path of the venv's python (built on first use, ~1 min; cached afterwards)
  smdebug_hook_run  (run_dir, expected): a finished run written by smdebug's PyTorch hook
  smdebug_raw_run   (run_dir, expected): every dtype written by smdebug's low-level FileWriter
  read_with_smdebug function run_dir -> dict: what smdebug's create_trial sees in run_dir

Set TRAINGUARD_SKIP_SMDEBUG=1 to skip these tests (e.g. on a machine without a C compiler).
"""

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # works under any --import-mode

from smdebug_env import ensure_smdebug_venv, run_smdebug_script  # noqa: E402


@pytest.fixture(scope="session")
def smdebug_python() -> Path:
    if os.environ.get("TRAINGUARD_SKIP_SMDEBUG") == "1":
        pytest.skip("TRAINGUARD_SKIP_SMDEBUG=1")
    return ensure_smdebug_venv()


def _run_writer(script, tmp_path_factory):
    base = tmp_path_factory.mktemp(Path(script).stem)
    run_dir, expected = base / "run", base / "expected.json"
    run_smdebug_script(script, run_dir, expected)
    return run_dir, json.loads(expected.read_text())


@pytest.fixture(scope="session")
def smdebug_hook_run(smdebug_python, tmp_path_factory):
    return _run_writer("write_with_smdebug.py", tmp_path_factory)


@pytest.fixture(scope="session")
def smdebug_raw_run(smdebug_python, tmp_path_factory):
    return _run_writer("write_raw_smdebug_events.py", tmp_path_factory)


@pytest.fixture
def read_with_smdebug(smdebug_python, tmp_path):
    def read(run_dir) -> dict:
        result = tmp_path / f"smdebug_read_{len(list(tmp_path.iterdir()))}.json"
        run_smdebug_script("read_with_smdebug.py", run_dir, result)
        return json.loads(result.read_text())

    return read
