"""A cached virtual environment with the real smdebug 1.0.34, for interoperability tests.

trainguard must read what smdebug writes and write what smdebug reads. The only honest check is
to run smdebug itself, but smdebug 1.0.34 (the last release, 2023) cannot live in trainguard's
own environment: it pins protobuf<=3.20.3 and needs numpy<2. So it gets its own venv, built
once and reused by every test run (and by bench/overhead.py).

Usage:
    from smdebug_env import ensure_smdebug_venv
    python = ensure_smdebug_venv()          # pathlib.Path of the venv's python

    python tests/interop/smdebug_env.py     # pre-build (CI); prints the python path

Location: $TRAINGUARD_SMDEBUG_VENV, default <repo root>/.cache/smdebug-venv. Base interpreter:
$TRAINGUARD_SMDEBUG_BASE_PYTHON, default the running one. It must be a CPython for which a local
torch==2.13.0 CPU wheel exists (3.11 here); elsewhere pip would fetch torch from PyPI.

What the pins are for (found by installing smdebug 1.0.34 on Python 3.11 with torch 2.13):
  * requests, pandas, psutil: imported at module level by smdebug.core.utils and
    smdebug.profiler.system_metrics_reader (reached from `import smdebug`,
    `import smdebug.pytorch` and `from smdebug.trials import create_trial`) but missing from
    the 1.0.34 wheel's Requires-Dist (fixed upstream after the release, never published).
  * numpy<2: smdebug.core.tfevent.util.make_tensor_proto calls ndarray.tostring(), which
    numpy 2.3+ removed (seen with 2.4): every tensor write fails with AttributeError.
  * protobuf==3.20.3: the wheel's generated *_pb2.py modules need protobuf 3.x (the wheel pins
    >=3.20.0,<=3.20.3). There is no cp311 binary wheel, so it runs the pure-Python backend.
  * pandas<3: pandas 3.x requires numpy>=2.0.2, which conflicts with numpy<2; the pin states
    the resolution up front (pandas 2.3.x, which supports numpy 1.26).
  * setuptools<81: smdebug.xgboost imports pkg_resources, which setuptools 81+ no longer ships.
    Not on the PyTorch path, but harmless and keeps the whole package importable.
  * torch==2.13.0: exact pin, so pip takes the local CPU wheel instead of downloading CUDA.
  * smdebug's dependency pyinstrument==3.4.2 pulls pyinstrument-cext, which exists only as an
    sdist: pip compiles it, so a C compiler (gcc) and the Python headers must be present.
No runtime workaround is needed for torch 2.13: smdebug.pytorch.utils accepts
1.5.0 <= torch < 3.0.0 (checked only by the zero-code-change get_hook path), and its
version-specific autograd-profiler branches run only when a profiler config enables them.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS_DIR = Path(__file__).resolve().parent / "smdebug_scripts"
ENV_VAR = "TRAINGUARD_SMDEBUG_VENV"

# Changing this list changes the marker contents, which makes every cached venv rebuild itself.
REQUIREMENTS = [
    "smdebug==1.0.34",
    "numpy<2",
    "protobuf==3.20.3",
    "pandas<3",
    "requests",
    "psutil",
    "setuptools<81",
    "torch==2.13.0",
]

# Run inside the new venv before it is declared good: exactly the imports the driver scripts use.
_CHECK = (
    "import numpy, google.protobuf, torch\n"
    "import smdebug.pytorch\n"
    "from smdebug.trials import create_trial\n"
    "from smdebug.core.writer import FileWriter\n"
    "assert int(numpy.__version__.split('.')[0]) < 2, numpy.__version__\n"
    "import smdebug; print('smdebug', smdebug.__version__, 'torch', torch.__version__,"
    " 'numpy', numpy.__version__, 'protobuf', google.protobuf.__version__)\n"
)

MARKER_NAME = ".trainguard-smdebug-ready"


def venv_dir() -> Path:
    return Path(os.environ.get(ENV_VAR) or REPO_ROOT / ".cache" / "smdebug-venv").resolve()


def _python_in(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _marker_contents() -> str:
    # What was installed: changing REQUIREMENTS makes existing venvs rebuild themselves.
    return json.dumps({"requirements": REQUIREMENTS}, sort_keys=True)


def _is_ready(venv: Path) -> bool:
    marker = venv / MARKER_NAME
    try:
        return marker.read_text() == _marker_contents() and _python_in(venv).exists()
    except OSError:
        return False


@contextlib.contextmanager
def _locked(lock_path: Path):
    """Exclusive inter-process lock (two pytest processes must not build the same venv)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as fh:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock, best effort
            yield
            return
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _run(cmd: list[str], log) -> None:
    log.write(f"\n$ {' '.join(cmd)}\n")
    log.flush()
    subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)


def _build(venv: Path) -> None:
    log_path = venv.parent / f"{venv.name}.build.log"
    started = time.monotonic()
    print(f"[smdebug_env] building {venv} (log: {log_path})", file=sys.stderr, flush=True)
    with open(log_path, "w") as log:
        try:
            # --clear: a half-built venv (no marker) is rebuilt from scratch.
            base = os.environ.get("TRAINGUARD_SMDEBUG_BASE_PYTHON") or sys.executable
            _run([base, "-m", "venv", "--clear", str(venv)], log)
            py = str(_python_in(venv))
            _run([py, "-m", "pip", "install", "--disable-pip-version-check", *REQUIREMENTS], log)
            _run([py, "-c", _CHECK], log)
        except subprocess.CalledProcessError as exc:
            log.flush()
            tail = log_path.read_text()[-4000:]
            raise RuntimeError(f"building the smdebug venv failed ({exc}); last lines of {log_path}:\n{tail}") from exc
    (venv / MARKER_NAME).write_text(_marker_contents())  # only after everything succeeded
    print(f"[smdebug_env] built in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)


def ensure_smdebug_venv() -> Path:
    """Return the python of a venv with smdebug 1.0.34, building it first if needed."""
    venv = venv_dir()
    if _is_ready(venv):
        return _python_in(venv)
    with _locked(venv.parent / f"{venv.name}.lock"):
        if not _is_ready(venv):  # another process may have built it while we waited
            _build(venv)
    return _python_in(venv)


def run_smdebug_script(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run tests/interop/smdebug_scripts/<name> with the smdebug venv's python.

    Raises CalledProcessError (with output attached) on failure.
    """
    python = ensure_smdebug_venv()
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # keep trainguard's src/ (and anything else) out of the venv
    env.pop("TRAINING_JOB_NAME", None)  # makes smdebug skip training_job_end.ts (a SageMaker job)
    proc = subprocess.run(
        [str(python), str(SCRIPTS_DIR / name), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, output=proc.stdout, stderr=proc.stderr)
    return proc


if __name__ == "__main__":
    print(ensure_smdebug_venv())
