"""What ``trainguard run`` hands the training command: the child's environment (the bootstrap
that arms the zero-code hook, the schedule, the overhead budget, the profiler), the rules of
``--rules`` and the hook config they need, all checked before training starts."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time
from pathlib import Path
from typing import Any

from trainguard.errors import ConfigError

__all__ = [
    "BOOTSTRAP_DIR", "DEFAULT_TEARDOWN_WARNING_SECONDS", "LIVE_RULES_MAX_INTERVAL", "TEARDOWN_WARNING_VARIABLE",
    "child_environment", "configure_capture", "default_out_dir", "judged_live", "overhead_budget",
    "rule_specs", "teardown_warning_seconds", "validate_before_start",
]  # fmt: skip

BOOTSTRAP_DIR = Path(__file__).resolve().parents[1] / "_bootstrap"
# A training command still running this long after its capture's end marker gets one warning
# naming its processes (nothing is stopped); TRAINGUARD_TEARDOWN_WARNING_SECONDS overrides.
TEARDOWN_WARNING_VARIABLE = "TRAINGUARD_TEARDOWN_WARNING_SECONDS"
DEFAULT_TEARDOWN_WARNING_SECONDS = 300.0
# Under --rules/--stop-on-issue the overhead budget spaces weights, gradients and outputs at most
# this many steps apart (500 otherwise): rules judging a run live need recent steps, and at 500 a
# fault such as a learning rate set to 0 can go unfound for the rest of the run.
LIVE_RULES_MAX_INTERVAL = 100
# What a container may set by hand to configure zero-code capture (CaptureConfig.from_environment).
_HAND_SET_CAPTURE_VARIABLES = (
    "TRAINGUARD_CONFIG", "TRAINGUARD_SAVE_INTERVAL", "TRAINGUARD_OVERHEAD_BUDGET", "TRAINGUARD_OVERHEAD_MAX_INTERVAL",
)  # fmt: skip


def default_out_dir() -> str:
    return os.path.join("trainguard-runs", time.strftime("%Y%m%d-%H%M%S"))


def child_environment(args: argparse.Namespace, out_dir: str) -> dict[str, str]:
    environment = dict(os.environ)
    # The bootstrap dir must come first: it holds the sitecustomize that arms the hook. The
    # package's own location is added so the child finds trainguard whatever its sys.path.
    package_root = str(Path(__file__).resolve().parents[2])
    existing = environment.get("PYTHONPATH", "")
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), package_root, existing) if p)
    environment["TRAINGUARD_ZERO_CODE"] = "1"
    environment["TRAINGUARD_OUT_DIR"] = out_dir  # the profiler's and the bootstrap's; the capture's is in its config
    # The capture's settings travel as one value (TRAINGUARD_CAPTURE, configure_capture); what a
    # container sets by hand must not mix in with them.
    for name in _HAND_SET_CAPTURE_VARIABLES:
        environment.pop(name, None)
    if args.save_interval is not None and args.save_interval < 1:
        raise ConfigError(f"--save-interval {args.save_interval} must be a positive number of steps")
    if args.profile:
        environment["TRAINGUARD_PROFILER"] = "1"
    if args.profile_interval_ms is not None:
        if args.profile_interval_ms <= 0:
            raise ConfigError(
                f"--profile-interval-ms {args.profile_interval_ms} must be a positive number of milliseconds"
            )
        environment["TRAINGUARD_PROFILER"] = "1"
        environment["TRAINGUARD_PROFILER_INTERVAL_MS"] = str(args.profile_interval_ms)
    return environment


def overhead_budget(args: argparse.Namespace) -> float:
    """The capture's share of training time: given, or the default unless the user fixed the
    schedule (--save-interval, --config); 0 keeps the schedule as configured."""
    from trainguard.zero_code import DEFAULT_OVERHEAD_BUDGET

    if args.overhead_budget is not None:
        if not 0 <= args.overhead_budget < 1:
            raise ConfigError(f"--overhead-budget {args.overhead_budget} must be a fraction from 0 to below 1")
        return args.overhead_budget
    fixed = args.save_interval is not None or args.config
    return 0.0 if fixed else DEFAULT_OVERHEAD_BUDGET


def judged_live(args: argparse.Namespace) -> bool:
    return args.rules is not None or args.stop_on_issue


def rule_specs(args: argparse.Namespace) -> list[Any]:
    """The rules of ``--rules`` (``default`` = the default set, with the profiler rules under
    ``--profile``); with ``--stop-on-issue`` each gets the stoptraining action.

    ``NAME:name=CONFIG,...`` names a configuration, so that one rule can run twice with different
    parameters (``StepOutlier:name=fast,stddev=3 --rules StepOutlier:name=slow,stddev=6``); two
    configurations given explicitly under one name are an error. A configuration of the default
    set is replaced by a later one of its name (``--rules default --rules ExplodingTensor:...``).
    """
    args.named_rules = set()
    if not judged_live(args):
        return []  # before the imports: rule machinery is not loaded for a run without rules
    from trainguard.commands.rules import parse_rule_list
    from trainguard.rules.defaults import default_rule_specs

    values = list(args.rules or [])
    if args.stop_on_issue and not values:
        values = ["default"]
    specs: dict[str, Any] = {}
    named: set[str] = set()
    for value in values:
        for spec in parse_rule_list(value):
            from_default_set = spec.rule.lower() == "default" and not spec.parameters
            if from_default_set:
                chosen = default_rule_specs()
                if args.profile or args.profile_interval_ms is not None:
                    from trainguard.rules.profiler_defaults import default_profiler_rule_specs

                    chosen += default_profiler_rule_specs()
            else:
                chosen = [_configuration(spec)]
            for one in chosen:
                if not from_default_set and one.name in named:
                    raise ConfigError(
                        f"--rules: two configurations are named {one.name!r}; give each its own name "
                        f"({one.rule}:name=NAME,...)"
                    )
                specs.pop(one.name, None)
                specs[one.name] = one
                if not from_default_set:
                    named.add(one.name)
    args.named_rules = named
    if args.stop_on_issue:
        stop = ({"name": "stoptraining"},)
        specs = {name: dataclasses.replace(spec, actions=tuple(spec.actions) + stop) for name, spec in specs.items()}
    return list(specs.values())


def _configuration(spec: Any) -> Any:
    """``name=`` of ``--rules NAME:name=CONFIG,...`` is the configuration's name (SageMaker's
    RuleConfigurationName), not a rule parameter."""
    parameters = dict(spec.parameters)
    name = parameters.pop("name", None)
    if name is None:
        return spec
    if not str(name).strip():
        raise ConfigError(f"--rules {spec.rule}:name= needs a configuration name")
    return dataclasses.replace(spec, parameters=parameters, configuration_name=str(name).strip())


def configure_capture(args: argparse.Namespace, specs: list[Any], environment: dict[str, str], out_dir: str) -> None:
    """The run's capture config, with the collections the rules need on top of the user's, put into
    ``environment`` as one value (``TRAINGUARD_CAPTURE``) that the training command reads back.

    Without rules the capture is for judging later (``trainguard rules run RUN``): it saves what
    the default rules read, unless ``--config`` says exactly what to save (then nothing is added).
    """
    from trainguard.config.capture_config import CAPTURE_VARIABLE, CaptureConfig
    from trainguard.config.json_config import read_hook_config
    from trainguard.config.save_config import SaveConfig
    from trainguard.rules.defaults import DEFAULT_RULE_COLLECTIONS, hook_config_for_rules

    collections: list[str] | None
    if specs:
        from trainguard.rules.defaults import rule_collections
        from trainguard.rules.runner import validate_specs

        classes = validate_specs(specs).values()
        collections = rule_collections(classes)
        if any(getattr(cls, "kind", "debugger") == "profiler" for cls in classes):
            environment.setdefault("TRAINGUARD_PROFILER", "1")  # a profiler rule named: its data is recorded
    elif args.config:
        collections = None
    else:
        collections = list(DEFAULT_RULE_COLLECTIONS)  # no rule imported: numpy stays unloaded before the start
    if collections is None:
        document = read_hook_config(Path(args.config).resolve())
    else:
        document = hook_config_for_rules(collections, base_config=args.config, save_interval=args.save_interval)
    config = CaptureConfig.from_hook_config(document, drop_unknown_collections=False)
    changes: dict[str, Any] = {"out_dir": out_dir, "overhead_budget": overhead_budget(args)}
    if judged_live(args):
        changes["overhead_max_interval"] = LIVE_RULES_MAX_INTERVAL
    if config.save_config is None and args.save_interval is not None:
        changes["save_config"] = SaveConfig(save_interval=args.save_interval)
    environment[CAPTURE_VARIABLE] = config.replace(**changes).with_zero_code_defaults().to_json()


def validate_before_start(environment: dict[str, str], out_dir: str) -> None:
    """Fail before training on a bad config or an unusable out_dir."""
    from trainguard.format.layout import END_OF_TRAINING
    from trainguard.hooks.run_end import peer_wait_seconds
    from trainguard.storage import LocalStore, open_store
    from trainguard.zero_code import capture_config

    capture_config(environment, drop_unknown_collections=False)  # as the training command will read it
    peer_wait_seconds(environment)
    teardown_warning_seconds(environment)
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


def teardown_warning_seconds(environment: dict[str, str]) -> float:
    raw = environment.get(TEARDOWN_WARNING_VARIABLE)
    if raw is None or raw == "":
        return DEFAULT_TEARDOWN_WARNING_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{TEARDOWN_WARNING_VARIABLE}={raw!r} must be a positive number of seconds")
    return seconds
