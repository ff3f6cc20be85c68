"""A cached virtual environment with the real SageMaker Python SDK, for compatibility tests.

SageMaker users submit jobs with the SDK's estimators, not with hand-written CreateTrainingJob
requests, so the honest check of the SageMaker endpoint is the SDK itself. It lives in a venv of
its own: it pins numpy, protobuf and others to ranges trainguard's environment does not share.

Usage:
    from tests.services.sdk_env import ensure_sdk_venv
    python = ensure_sdk_venv()      # pathlib.Path of the venv's python (None if it cannot be built)

    python tests/services/sdk_env.py   # pre-build (CI); prints the python path

Location: $TRAINGUARD_SDK_VENV, default <repo root>/.cache/sagemaker-sdk-venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ENV_VAR = "TRAINGUARD_SDK_VENV"
# SDK 2.x is what SageMaker users' estimator code is written against (2.257 is its last line);
# changing this list rebuilds cached venvs (the marker holds it).
REQUIREMENTS = ["sagemaker==2.257.7"]


def venv_dir() -> Path:
    return Path(os.environ.get(ENV_VAR) or REPO_ROOT / ".cache" / "sagemaker-sdk-venv")


def _python(directory: Path) -> Path:
    return directory / "bin" / "python"


def ensure_sdk_venv() -> Path:
    """Build the venv once (a few minutes), then reuse it; raises RuntimeError if pip fails."""
    directory = venv_dir()
    marker = directory / "trainguard-requirements.json"
    if marker.is_file() and json.loads(marker.read_text()) == REQUIREMENTS and _python(directory).exists():
        return _python(directory)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(directory)], check=True)
    result = subprocess.run(
        [str(_python(directory)), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *REQUIREMENTS],
        capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(REQUIREMENTS)} failed:\n{result.stderr[-3000:]}")
    marker.write_text(json.dumps(REQUIREMENTS))
    return _python(directory)


# -- helpers for the tests that drive the SDK (tests/services, tests/e2e) ----------------------
SCRIPT = Path(__file__).resolve().parent / "sdk_scripts" / "pytorch_estimator.py"
EXAMPLE = REPO_ROOT / "examples" / "sagemaker_sdk"


@pytest.fixture(scope="module")
def sdk_python() -> Path:
    try:
        return ensure_sdk_venv()
    except (RuntimeError, subprocess.CalledProcessError) as error:
        pytest.skip(f"the SageMaker SDK venv cannot be built here: {error}")


def run_sdk(python: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """Run the SDK script with ``settings``; what it read back, plus its ``stdout``."""
    command = [str(python), str(SCRIPT), json.dumps(settings)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    lines = [line for line in result.stdout.splitlines() if line.startswith("SDK-RESULT ")]
    assert lines, f"the SDK script failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    answer = json.loads(lines[-1].removeprefix("SDK-RESULT "))
    answer["stdout"] = result.stdout
    return answer


def source_dir(tmp_path: Path) -> Path:
    """A copy of the example's source directory (what the SDK packs into sourcedir.tar.gz)."""
    source = tmp_path / "source"
    shutil.copytree(EXAMPLE / "source", source)
    return source


def seed_data(client: Any, bucket: str) -> str:
    """The example's training channel on S3; its URI."""
    rows = [f"{a / 10:.2f},{b / 10:.2f},{(a - b) / 10:.2f}" for a in range(8) for b in range(8)]
    client.put_object(Bucket=bucket, Key="datasets/xy/data.csv", Body="\n".join(rows).encode())
    return f"s3://{bucket}/datasets/xy"


if __name__ == "__main__":
    print(ensure_sdk_venv())
