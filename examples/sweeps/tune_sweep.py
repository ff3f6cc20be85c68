"""A Ray Tune sweep in which trainguard stops the trials whose training goes wrong.

Four trials of examples/sweeps/toy_training.py (two sane learning rates, one far too high, one
saturated initialisation). Each trial's training is captured by trainguard's PyTorch hook into
its trial directory; :class:`trainguard.integrations.tune.TuneGuard` runs the default rules over
it while it trains and reports their verdict with every result (``trainguard_stop``,
``trainguard_issue``, ``trainguard_rule``, ``trainguard_step``); ``TrainguardStopper`` stops the
trials with a certain finding:

    pip install 'trainguard[tune]'
    python examples/sweeps/tune_sweep.py --out /tmp/tune-sweep
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ray import tune

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toy_training  # noqa: E402

from trainguard.integrations.tune import TrainguardStopper, TuneGuard  # noqa: E402


def run_sweep(
    out_root: str, configs: tuple[dict[str, Any], ...] = toy_training.CONFIGS, *, stop_in_trainable: bool = True
) -> tune.ResultGrid:
    """Run one trial per config (one per CPU at a time); the result grid, one result per config.

    ``stop_in_trainable=False``: a trial goes on training after a finding, so only
    ``TrainguardStopper`` can end it early.
    """
    here = os.path.dirname(os.path.abspath(__file__))

    # Defined here, not at module level: Ray pickles a nested function by value, so the worker
    # processes need not import this example as a module.
    def trainable(config: dict[str, Any]) -> None:
        sys.path.insert(0, config["examples_dir"])  # the trial runs in a Ray worker process
        import toy_training

        out_dir = os.path.join(config["out_root"], config["name"])
        with TuneGuard(out_dir) as guard:

            def on_epoch(epoch: int, steps: int, last_saved: int, loss: float) -> bool:
                stop = guard.report({"loss": loss, "steps": steps}, wait_for_step=last_saved)
                # Without stop_in_trainable only TrainguardStopper ends the trial (the tests check it).
                return stop and config.get("stop_in_trainable", True)

            toy_training.train(config, out_dir, on_epoch)

    space = {
        "config": tune.grid_search([{**c, "stop_in_trainable": stop_in_trainable} for c in configs]),
        "out_root": out_root,
        "examples_dir": here,
    }

    def flat(config: dict[str, Any]) -> None:  # grid over whole config dicts, flattened for train
        trainable({**config["config"], "out_root": config["out_root"], "examples_dir": config["examples_dir"]})

    tuner = tune.Tuner(
        tune.with_resources(flat, {"cpu": 1}),
        param_space=space,
        run_config=tune.RunConfig(
            name="trainguard-sweep", storage_path=os.path.join(out_root, "ray_results"),
            stop=TrainguardStopper(), verbose=0,
        ),
    )  # fmt: skip
    return tuner.fit()


def main() -> None:
    import ray

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="/tmp/trainguard-tune-sweep")
    parser.add_argument("--num-cpus", type=int, default=2)
    args = parser.parse_args()
    # address="local": a new instance of our own, even where a cluster already runs on this machine
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False)
    results = run_sweep(os.path.abspath(args.out))
    for result in results:
        name, metrics = result.config["config"]["name"], result.metrics
        verdict = f"stopped: {metrics['trainguard_issue']}" if metrics.get("trainguard_stop") else "finished"
        print(f"{name}: {metrics['steps']} steps, loss {metrics['loss']:.4f}, {verdict}")


if __name__ == "__main__":
    main()
