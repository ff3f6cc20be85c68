"""``trainguard report PATH [-o report.html] [--steps 0,50,100] [--endpoint-url URL]``."""

from __future__ import annotations

import argparse
import sys

from trainguard.errors import ConfigError, TrainguardError
from trainguard.storage.options import add_storage_arguments

__all__ = ["parse_steps", "register"]


def parse_steps(text: str | None) -> list[int] | None:
    """``"0,50,100"`` → ``[0, 50, 100]``; empty → None (first, middle and last saved step)."""
    if not text or not text.strip():
        return None
    steps = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            step = int(item)
        except ValueError:
            raise ConfigError(
                f"--steps {text!r}: {item!r} is not a step number; give global steps like 0,50,100"
            ) from None
        if step < 0:
            raise ConfigError(f"--steps {text!r}: step {step} is negative; steps start at 0")
        steps.append(step)
    return steps or None


def _report(args: argparse.Namespace) -> int:
    from trainguard.report import write_report

    if args.max_points < 2:
        raise ConfigError(f"--max-points {args.max_points}: give at least 2")
    try:
        data = write_report(
            args.run,
            args.output,
            steps=parse_steps(args.steps),
            endpoint_url=args.endpoint_url,
            max_points=args.max_points,
        )
    except OSError as error:  # the output file, not the run: storage errors are TrainguardErrors
        if isinstance(error, TrainguardError):
            raise
        raise ConfigError(
            f"-o {args.output}: cannot write the report ({error.strerror or error}); choose another path"
        ) from None
    print(
        f"trainguard: wrote {args.output} ({data.rules} rule result(s), {data.findings} finding(s), "
        f"{data.nonfinite_markers} NaN/inf marker(s); read in {data.read_seconds:.2f} s)",
        file=sys.stderr,
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report", help="write a self-contained HTML report of a run")
    parser.add_argument("run", help="the run: the hook's out_dir, a local directory or s3://bucket/prefix")
    parser.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")
    parser.add_argument(
        "--steps", help="global steps for the weight histograms, e.g. 0,50,100 (default first, middle, last)"
    )
    add_storage_arguments(parser)
    parser.add_argument(
        "--max-points", type=int, default=600,
        help="most points drawn per curve (default 600; every saved step is read, min/max per bucket kept)",
    )  # fmt: skip
    parser.set_defaults(func=_report)
