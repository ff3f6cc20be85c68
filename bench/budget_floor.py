"""What the overhead budget's floor costs: the GCN of tests/hooks/every_parameter_scripts (a
~1 ms full-batch step, capture far over the 1 % budget) captured as ``trainguard run --rules``
captures it (default rules' collections, budget 1 %, heavy saves at most 100 steps apart), with
the floor (hooks/overhead_budget.py) and without it (both floors 0), in alternating turns.

Reported per variant: TRAIN saves kept (losses, weights), the training process's CPU seconds
(time.process_time of the script, its writer process excluded) and wall seconds, medians.

    python -m bench.budget_floor [--runs 3] [--epochs 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "hooks" / "every_parameter_scripts" / "gcn.py"
# The child: the budget's floors set (None: the defaults), the script run, its cost printed.
CHILD = """
import json, runpy, sys, time
import trainguard.hooks.overhead_budget as budget
floors = json.loads(sys.argv[1])
if floors is not None:
    original = budget.OverheadBudget.__init__
    def init(self, *args, **kwargs):
        kwargs.setdefault("light_floor", floors[0]); kwargs.setdefault("heavy_floor", floors[1])
        original(self, *args, **kwargs)
    budget.OverheadBudget.__init__ = init
sys.argv = [sys.argv[2], *sys.argv[3:]]
cpu, wall = time.process_time(), time.perf_counter()
runpy.run_path(sys.argv[0], run_name="__main__")
print("COST", json.dumps({"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall}))
"""


def _environment(out_dir: str, config: str) -> dict[str, str]:
    from trainguard.launch.options import BOOTSTRAP_DIR, LIVE_RULES_MAX_INTERVAL

    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP_DIR), str(REPO / "src"), environment.get("PYTHONPATH", "")])
    environment.update(
        TRAINGUARD_ZERO_CODE="1",
        TRAINGUARD_OUT_DIR=out_dir,
        TRAINGUARD_CONFIG=config,
        TRAINGUARD_OVERHEAD_BUDGET="0.01",
        TRAINGUARD_OVERHEAD_MAX_INTERVAL=str(LIVE_RULES_MAX_INTERVAL),
    )
    return environment


def _one(floors: list[int] | None, epochs: int, work: Path, config: str) -> dict[str, float]:
    from trainguard.modes import ModeKeys
    from trainguard.trials import create_trial

    out_dir = tempfile.mkdtemp(dir=work)
    command = [sys.executable, "-c", CHILD, json.dumps(floors), str(SCRIPT), "--epochs", str(epochs)]
    done = subprocess.run(command, env=_environment(out_dir, config), capture_output=True, text=True, check=True)
    cost = json.loads(done.stdout.split("COST", 1)[1])
    trial = create_trial(out_dir)
    loss = trial.tensor(trial.tensor_names(collection="losses")[0]).steps(ModeKeys.TRAIN)
    weight = trial.tensor(trial.tensor_names(collection="weights")[0]).steps(ModeKeys.TRAIN)
    return {**cost, "losses": len(loss), "weights": len(weight)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=200)
    args = parser.parse_args()
    from trainguard.rules import builtin_rules
    from trainguard.rules.defaults import DEFAULT_RULES, hook_config_for_rules, rule_collections

    rules = builtin_rules()
    document = hook_config_for_rules(rule_collections([rules[name] for name in DEFAULT_RULES if name in rules]))
    variants = {"floor": None, "no floor": [0, 0]}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as work:
        config = os.path.join(work, "debughookconfig.json")
        Path(config).write_text(json.dumps(document))
        for _ in range(args.runs):
            for name, floors in variants.items():
                results[name].append(_one(floors, args.epochs, Path(work), config))
    for name, runs in results.items():
        medians = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        print(f"{name:9s} TRAIN losses {medians['losses']:.0f}, weights {medians['weights']:.0f}; "
              f"training process CPU {medians['cpu']:.2f} s, wall {medians['wall']:.2f} s "
              f"(CPU of each run: {' '.join(format(run['cpu'], '.2f') for run in runs)})")  # fmt: skip


if __name__ == "__main__":
    main()
