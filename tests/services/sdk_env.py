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
import subprocess
import sys
from pathlib import Path

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


if __name__ == "__main__":
    print(ensure_sdk_venv())
