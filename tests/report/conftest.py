"""Fixtures of the report tests: one real training run per session, with rule and profiler files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the report tests train a tiny PyTorch model: pip install torch==2.13.0")

from tests.report._fixtures import profiler_output_files, rule_output_files  # noqa: E402
from tests.report._run import train_run  # noqa: E402
from tests.s3_server import s3_bucket, s3_endpoint  # noqa: E402, F401  (fixtures)


@pytest.fixture(scope="session")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tensors only: 30 TRAIN + 12 EVAL steps, saved every 2 steps (accuracy at every EVAL step)."""
    return train_run(tmp_path_factory.mktemp("report") / "plain-run")


@pytest.fixture(scope="session")
def full_run(plain_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tensors plus rule-output/*.json and profiler-output/ files."""
    run = tmp_path_factory.mktemp("report") / "full-run"
    shutil.copytree(plain_run, run)
    rule_output_files(run)
    profiler_output_files(run)
    return run


@pytest.fixture(scope="session")
def reductions_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Only l2 norms and zero fractions saved for weights, gradients and activations."""
    return train_run(tmp_path_factory.mktemp("report") / "reductions-run", epochs=1, reductions_only=True)


@pytest.fixture(scope="session")
def profiled_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One epoch trained under trainguard's own Profiler (system metrics every 100 ms, step timings)."""
    from trainguard.profiler import Profiler

    run = tmp_path_factory.mktemp("report") / "profiled-run"
    with Profiler(str(run), interval_ms=100):
        train_run(run, epochs=2)
    return run
