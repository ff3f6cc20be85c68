"""One real ``trainguard run ... -- torchrun`` job of the PyTorch examples' DDP program
(bench/ddp_teardown.py), read through pipes as CI reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import ddp_teardown

# The default rules with stops, and Straggler (which turns the profiler on)
OPTIONS = "--rules default --rules Straggler --stop-on-issue"


def torchrun_job(tmp_path: Path, *options: str, trainguard: str = OPTIONS) -> dict[str, Any]:
    """The run's record (bench/ddp_teardown.one_run); its capture is ``tmp_path / "run-1"``. A run
    still going 120 s after training is dumped (py-spy) under ``tmp_path / "dumps"`` and killed."""
    args = ddp_teardown.build_parser().parse_args(
        ["--nproc", "2", "--hang-after", "120", "--training-limit", "480", "--dump-dir", str(tmp_path / "dumps"),
         "--trainguard", trainguard, *options]
    )  # fmt: skip
    return ddp_teardown.one_run(args, 1, tmp_path)


def rule_output(tmp_path: Path, rule: str) -> dict[str, Any]:
    return json.loads((tmp_path / "run-1" / "rule-output" / f"{rule}.json").read_text())


def dumps(tmp_path: Path) -> list[str]:
    folder = tmp_path / "dumps"
    return [path.read_text()[-6000:] for path in sorted(folder.glob("*"))] if folder.exists() else []
