"""What TrialGuard's waits cost a small Optuna study (issue 46): the 4 trials of
examples/sweeps/toy_training.py (2 healthy, 2 bad), three ways of asking ``should_prune``:

* ``written``: ``wait_for_step`` = the last step the hook has written (as documented);
* ``current``: ``wait_for_step`` = the step just trained, which the PyTorch hook writes only when
  the next step begins (the issue's case: each poll waited for its whole timeout);
* ``none``: no ``wait_for_step`` (the guard judges what is written so far).

    python bench/optuna_waits.py [--modes written,current,none] [--out DIR]

Prints, per mode, the study's wall time and each trial's state, steps trained and finding.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import optuna

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "sweeps")
sys.path.insert(0, EXAMPLES)
import toy_training  # noqa: E402

from trainguard.integrations.optuna import FINDING_ATTR, TrialGuard  # noqa: E402


def study(out_root: str, mode: str) -> tuple[float, list[str]]:
    study = optuna.create_study(direction="minimize", pruner=optuna.pruners.NopPruner())
    for config in toy_training.CONFIGS:
        study.enqueue_trial({"lr": config["lr"], "init_scale": config["init_scale"]})

    def objective(trial: optuna.Trial) -> float:
        config = {"lr": trial.suggest_float("lr", 1e-4, 10.0, log=True),
                  "init_scale": trial.suggest_float("init_scale", 0.1, 1e4, log=True)}  # fmt: skip
        out_dir = os.path.join(out_root, mode, f"trial-{trial.number}")
        losses: list[float] = []
        pruned: list[str] = []
        with TrialGuard(trial, out_dir) as guard:

            def on_epoch(epoch: int, steps: int, last_saved: int, loss: float) -> bool:
                losses.append(loss)
                trial.set_user_attr("steps", steps)
                trial.report(loss, epoch)
                wait = {"written": last_saved, "current": steps - 1, "none": None}[mode]
                if guard.should_prune(wait_for_step=wait):
                    pruned.append(guard.reason)
                    return True
                return False

            toy_training.train(config, out_dir, on_epoch)
        if pruned:
            raise optuna.TrialPruned(pruned[0])
        return losses[-1]

    started = time.monotonic()
    study.optimize(objective, n_trials=len(toy_training.CONFIGS))
    seconds = time.monotonic() - started
    lines = []
    for trial in study.trials:
        finding = trial.user_attrs.get(FINDING_ATTR)
        what = f"{finding['rule']} at step {finding['step']}" if finding else "-"
        lines.append(f"  trial {trial.number}: {trial.state.name:8} {trial.user_attrs.get('steps')} steps, {what}")
    return seconds, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default="written,current,none")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out_root = args.out or tempfile.mkdtemp(prefix="trainguard-optuna-waits-")
    for mode in args.modes.split(","):
        seconds, lines = study(out_root, mode)
        print(f"{mode}: {seconds:.1f} s", flush=True)
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
