"""An Optuna study in which trainguard prunes the trials whose training goes wrong.

Four trials of examples/sweeps/toy_training.py (two sane learning rates, one far too high, one
saturated initialisation). Each trial's training is captured by trainguard's PyTorch hook into
its own directory; :class:`trainguard.integrations.optuna.TrialGuard` runs the default rules over
it while it trains and prunes the trial on a certain finding, storing the finding as the trial's
``trainguard_finding`` user attribute:

    pip install 'trainguard[optuna]'
    python examples/sweeps/optuna_sweep.py --out /tmp/optuna-sweep
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import optuna

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toy_training  # noqa: E402

from trainguard.integrations.optuna import FINDING_ATTR, TrialGuard  # noqa: E402


def run_sweep(out_root: str, configs: tuple[dict[str, Any], ...] = toy_training.CONFIGS) -> optuna.Study:
    """Run one trial per config; returns the study (trial user attrs: steps, trainguard_finding)."""
    study = optuna.create_study(direction="minimize", pruner=optuna.pruners.NopPruner())
    for config in configs:
        study.enqueue_trial({"lr": config["lr"], "init_scale": config["init_scale"]})

    def objective(trial: optuna.Trial) -> float:
        config = {
            "lr": trial.suggest_float("lr", 1e-4, 10.0, log=True),
            "init_scale": trial.suggest_float("init_scale", 0.1, 1e4, log=True),
        }
        out_dir = os.path.join(out_root, f"trial-{trial.number}")
        losses: list[float] = []
        pruned: list[str] = []
        with TrialGuard(trial, out_dir) as guard:

            def on_epoch(epoch: int, steps: int, last_saved: int, loss: float) -> bool:
                losses.append(loss)
                trial.set_user_attr("steps", steps)
                trial.report(loss, epoch)
                if guard.should_prune(wait_for_step=last_saved):
                    pruned.append(guard.reason)
                    return True
                return False

            toy_training.train(config, out_dir, on_epoch)
        if pruned:  # raised after the hook closed and the rules finished
            raise optuna.TrialPruned(pruned[0])
        return losses[-1]

    study.optimize(objective, n_trials=len(configs))
    return study


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="/tmp/trainguard-optuna-sweep")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = run_sweep(args.out)
    for trial in study.trials:
        finding = trial.user_attrs.get(FINDING_ATTR)
        verdict = f"pruned: {finding['rule']} at step {finding['step']}" if finding else f"loss {trial.value:.4f}"
        print(f"trial {trial.number} {trial.params}: {trial.state.name}, {trial.user_attrs['steps']} steps, {verdict}")


if __name__ == "__main__":
    main()
