"""The ``trainguard`` command.

trainguard run [--out DIR] [--config hook.json] [--save-interval N | --overhead-budget F]
               [--rules [A,B:key=v,...]] [--stop-on-issue] [--stop-grace S] [--allow-not-evaluated]
               [--profile] [--profile-interval-ms MS] -- python train.py ...
trainguard summary RUN [--json]
trainguard tensorboard RUN OUT_DIR

Every verb that reads or writes a run takes --endpoint-url, --profile (--aws-profile; only that on
``run``, whose --profile records system metrics) and --region for s3:// runs
(:mod:`trainguard.storage.options`).

``trainguard run`` exits with the training command's status, 3 when a rule stopped training (only
certain findings stop it), and 4 when training succeeded but a rule named in ``--rules`` could not
evaluate the run (its data is missing) unless ``--allow-not-evaluated``. Rules of the implicit
default set that could not evaluate are reported as such but leave the status alone.

A training command still running TRAINGUARD_TEARDOWN_WARNING_SECONDS (default 300) after its
capture's end-of-training marker gets one warning on stderr naming its processes (stuck in
teardown?); nothing is stopped.
"""

from __future__ import annotations

import argparse
import sys

from trainguard.errors import TrainguardError

__all__ = ["main"]


def _tensorboard(args: argparse.Namespace) -> int:
    from trainguard.tensorboard import export_run

    def progress(done: int, total: int) -> None:  # a long run's export shows it is moving
        print(f"trainguard: tensorboard: {done}/{total} steps converted", file=sys.stderr, flush=True)

    counts = export_run(args.run, args.out_dir, progress=progress)
    print(f"trainguard: wrote {counts} to {args.out_dir}; view with: tensorboard --logdir {args.out_dir}")
    return 0


def build_parser(all_verbs: bool = True) -> argparse.ArgumentParser:
    """The parser of every verb; ``all_verbs=False`` leaves out the verbs of trainguard.commands
    and plugins (``trainguard run`` starts training sooner without importing them)."""
    from trainguard.storage.options import add_storage_arguments

    parser = argparse.ArgumentParser(prog="trainguard", description="Capture and check tensors of training jobs.")
    commands = parser.add_subparsers(dest="verb", required=True)
    run = commands.add_parser("run", help="run a training command with zero-code capture")
    run.add_argument("--out", help="where to write the run (directory or s3://); default trainguard-runs/<time>")
    run.add_argument("--config", help="hook config: SageMaker DebugHookConfig JSON (debughookconfig.json)")
    run.add_argument("--save-interval", type=int, help="save every N steps (default 10; the config file wins)")
    run.add_argument(
        "--overhead-budget",
        type=float,
        help="share of training time the capture may take (default 0.01 unless --save-interval or --config "
        "fixes the schedule): past its first 20 saves (16 when far over budget), weights, gradients and "
        "outputs are saved on fewer steps (at least every 500; every 100 under --rules/--stop-on-issue) when "
        "saving costs more, then losses and scalars (at least every 100) if they alone cost more; 0: the "
        "schedule as configured",
    )
    run.add_argument(
        "--rules", action="append", nargs="?", const="default", metavar="A,B:key=v",
        help="run rules beside training (no value: the default set; 'trainguard rules list' shows all)",
    )  # fmt: skip
    run.add_argument("--stop-on-issue", action="store_true", help="stop training when a rule fires (implies --rules)")
    run.add_argument(
        "--allow-not-evaluated", action="store_true",
        help="exit with training's status even when a named rule could not evaluate the run (default: 4 then)",
    )  # fmt: skip
    run.add_argument("--stop-grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL (default 10)")
    run.add_argument("--profile", action="store_true", help="also record system and framework metrics")
    run.add_argument("--profile-interval-ms", type=int, help="profiler sampling interval (implies --profile)")
    add_storage_arguments(run, profile_flag=False)  # --profile records system metrics here
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- followed by the training command")
    summary = commands.add_parser("summary", help="summarise a captured run")
    summary.add_argument("run")
    summary.add_argument("--json", action="store_true")
    add_storage_arguments(summary)
    board = commands.add_parser("tensorboard", help="export a run as TensorBoard event files")
    board.add_argument("run")
    board.add_argument("out_dir")
    add_storage_arguments(board)
    if all_verbs:
        _register_command_modules(commands)
    return parser


def _register_command_modules(commands: argparse._SubParsersAction) -> None:
    """Add the verbs defined in trainguard.commands (see its docstring)."""
    import importlib
    import pkgutil

    from trainguard import commands as package

    for module_info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
        if not module_info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{module_info.name}").register(commands)
    _register_plugin_commands(commands)


def _register_plugin_commands(commands: argparse._SubParsersAction) -> None:
    """Add verbs other packages declare in the ``trainguard.commands`` entry-point group (``serve``).

    A plugin that fails to load (its extra not installed, a broken install) costs only its verb:
    the rest of the CLI must keep working, so the failure is reported on stderr and skipped.
    """
    from importlib.metadata import entry_points

    for entry_point in sorted(entry_points(group="trainguard.commands"), key=lambda point: point.name):
        try:
            entry_point.load()(commands)
        except Exception as error:  # noqa: BLE001 - one broken plugin must not take the CLI down
            print(f"trainguard: command {entry_point.name!r} unavailable: {error}", file=sys.stderr)


def _dispatch(args: argparse.Namespace) -> int:
    if args.verb == "run":
        from trainguard.launch.supervise import run_command

        return run_command(args)
    if args.verb in ("summary", "tensorboard"):
        from trainguard.storage import require_local_path

        require_local_path(args.run)  # a typo is an error at once, not "nothing captured"
    if args.verb == "summary":
        from trainguard.summary import print_summary

        print_summary(args.run, args.json, strict=True)
        return 0
    if args.verb == "tensorboard":
        return _tensorboard(args)
    return int(args.func(args) or 0)


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    # Every moment before `trainguard run` starts the command delays training: the other verbs'
    # modules (the API client, rule commands) and plugin entry points are not loaded for it.
    run_only = bool(words) and words[0] == "run"
    args = build_parser(all_verbs=not run_only).parse_args(argv)
    from trainguard.storage.options import storage_options_from_args

    try:
        # Every store this command opens, and every process it starts, reaches s3:// with the
        # same options (restored afterwards: main() may be called in a longer-lived process).
        with storage_options_from_args(args).exported():
            return _dispatch(args)
    except TrainguardError as error:
        print(f"trainguard: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
