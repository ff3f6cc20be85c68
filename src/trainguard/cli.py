"""The ``trainguard`` command.

    trainguard run [--out DIR] [--config hook.json] [--save-interval N] -- python train.py ...
    trainguard summary RUN [--json]
    trainguard tensorboard RUN OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainguard.errors import ConfigError, TrainguardError

__all__ = ["main"]

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "_bootstrap"


def _default_out_dir() -> str:
    return os.path.join("trainguard-runs", time.strftime("%Y%m%d-%H%M%S"))


def _child_environment(args: argparse.Namespace, out_dir: str) -> dict[str, str]:
    environment = dict(os.environ)
    # The bootstrap dir must come first: it holds the sitecustomize that arms the hook. The
    # package's own location is added so the child finds trainguard whatever its sys.path.
    package_root = str(Path(__file__).resolve().parents[1])
    existing = environment.get("PYTHONPATH", "")
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), package_root, existing) if p)
    environment["TRAINGUARD_ZERO_CODE"] = "1"
    environment["TRAINGUARD_OUT_DIR"] = out_dir
    if args.config:
        environment["TRAINGUARD_CONFIG"] = str(Path(args.config).resolve())
    if args.save_interval is not None:
        environment["TRAINGUARD_SAVE_INTERVAL"] = str(args.save_interval)
    return environment


def _validate(environment: dict[str, str], out_dir: str) -> None:
    """Fail before training on a bad config or an unusable out_dir."""
    from trainguard.format.layout import END_OF_TRAINING
    from trainguard.storage import LocalStore, open_store
    from trainguard.zero_code import zero_code_hook_kwargs

    zero_code_hook_kwargs(environment)
    store = open_store(out_dir)
    if store.exists(END_OF_TRAINING):
        raise ConfigError(f"--out {out_dir} already holds a finished run: choose a new directory")
    if isinstance(store, LocalStore):
        try:
            store.root.mkdir(parents=True, exist_ok=True)
            probe = store.root / ".trainguard-probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as error:
            raise ConfigError(f"--out {out_dir} is not writable: {error.strerror or error}") from None


def _run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("nothing to run: trainguard run [options] -- python train.py ...")
    out_dir = args.out or _default_out_dir()
    environment = _child_environment(args, out_dir)
    _validate(environment, out_dir)
    print(f"trainguard: capturing to {out_dir}", file=sys.stderr, flush=True)
    child = subprocess.Popen(command, env=environment)

    def forward(signum: int, frame: object) -> None:
        child.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    returncode = child.wait()
    _print_summary(out_dir)
    return returncode


def _print_summary(path: str, as_json: bool = False) -> None:
    from trainguard.summary import describe_run, render_summary
    from trainguard.trial import create_trial

    try:
        trial = create_trial(path, collection_wait_timeout=0)
    except TrainguardError as error:
        print(f"trainguard: nothing captured at {path}: {error}", file=sys.stderr)
        return
    facts = describe_run(trial)
    print(json.dumps(facts, indent=2, default=str) if as_json else render_summary(facts), flush=True)


def _tensorboard(args: argparse.Namespace) -> int:
    from trainguard.tensorboard import export_run

    counts = export_run(args.run, args.out_dir)
    print(f"trainguard: wrote {counts} to {args.out_dir}; view with: tensorboard --logdir {args.out_dir}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainguard", description="Capture and check tensors of training jobs.")
    commands = parser.add_subparsers(dest="verb", required=True)
    run = commands.add_parser("run", help="run a training command with zero-code capture")
    run.add_argument("--out", help="where to write the run (directory or s3://); default trainguard-runs/<time>")
    run.add_argument("--config", help="hook config: SageMaker DebugHookConfig JSON (debughookconfig.json)")
    run.add_argument("--save-interval", type=int, help="save every N steps (default 10; the config file wins)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- followed by the training command")
    summary = commands.add_parser("summary", help="summarise a captured run")
    summary.add_argument("run")
    summary.add_argument("--json", action="store_true")
    board = commands.add_parser("tensorboard", help="export a run as TensorBoard event files")
    board.add_argument("run")
    board.add_argument("out_dir")
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.verb == "run":
            return _run(args)
        if args.verb == "summary":
            _print_summary(args.run, args.json)
            return 0
        if args.verb == "tensorboard":
            return _tensorboard(args)
        return int(args.func(args) or 0)
    except TrainguardError as error:
        print(f"trainguard: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
