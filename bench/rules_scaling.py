"""Rule scaling: does a rule's cost per evaluated step stay flat as the run grows?

Writes two synthetic runs with trainguard's own writer (:class:`~trainguard.writer.thread.StepWriter`,
the hook's format): ``--short`` (1,000) and ``--long`` (20,000) saved steps of a healthy-looking
training job: a noisy falling cross-entropy loss every step (TRAIN), a 5-step validation pass
(EVAL) every 200 steps, and a few small tensors (an 8x8 weight and its gradient, a bias, ReLU
outputs, the loss's logits and labels). Then runs every built-in debugger rule at its defaults
with the live runner (``RuleRunner``, what ``trainguard rules run`` uses), each rule alone in a
fresh process, on both runs, and prints steps/s per rule and the ratio long/short.

Target (issue 11): every rule evaluates the 20,000-step run at >= 90 % of the steps/s it reaches
on the 1,000-step run. Steps per CPU second (the process's own CPU time) is the primary figure:
on a shared machine wall time also measures the neighbours.

    python bench/rules_scaling.py                   # every debugger rule, 1,000 vs 20,000 steps
    python bench/rules_scaling.py --rules LossNotDecreasing,Overfit --long 5000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

VALIDATION_EVERY = 200
VALIDATION_STEPS = 5


def write_run(path: str, steps: int, seed: int = 0) -> float:
    """A synthetic run of ``steps`` saved steps at ``path``; returns the seconds it took."""
    from trainguard.config.collections import CollectionManager
    from trainguard.format.layout import END_OF_TRAINING, collections_key, worker_name
    from trainguard.modes import ModeKeys
    from trainguard.storage import open_store
    from trainguard.writer.thread import StepWriter

    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    os.makedirs(path, exist_ok=True)
    manager = CollectionManager.pytorch_defaults()
    manager.get("predictions").add_tensor_name("CrossEntropyLoss_input_0")
    manager.get("labels").add_tensor_name("CrossEntropyLoss_input_1")
    worker = worker_name(0)
    writer = StepWriter(open_store(path), worker)
    writer.write_object(collections_key(worker), manager.render(1))
    weight = rng.normal(0, 0.3, (8, 8)).astype(np.float32)
    mode_steps = {ModeKeys.TRAIN: 0, ModeKeys.EVAL: 0}
    train_step = 0
    for step in range(steps):
        in_validation = train_step > 0 and train_step % VALIDATION_EVERY == 0 and mode_steps[ModeKeys.EVAL] < (
            train_step // VALIDATION_EVERY) * VALIDATION_STEPS  # fmt: skip
        mode = ModeKeys.EVAL if in_validation else ModeKeys.TRAIN
        progress = train_step / max(steps, 1)
        level = 0.2 + 2.1 * np.exp(-5 * progress)
        tensors: dict[str, np.ndarray] = {}
        labels = rng.integers(0, 5, 16)
        # a model that is mostly right (about 95 % of the labels): the classification rules look
        # at every step but have nothing to report, as on a healthy job
        logits = 4.0 * np.eye(5, dtype=np.float32)[labels] + rng.normal(0, 1, (16, 5)).astype(np.float32)
        tensors["CrossEntropyLoss_output_0"] = np.array([level * (1 + rng.normal(0, 0.1))], dtype=np.float32)
        tensors["CrossEntropyLoss_input_0"] = logits.astype(np.float32)
        tensors["CrossEntropyLoss_input_1"] = labels.astype(np.int64)
        if mode == ModeKeys.TRAIN:
            gradient = rng.normal(0, 0.01, (8, 8)).astype(np.float32)
            weight = weight - 0.1 * gradient
            tensors["fc.weight"] = weight
            tensors["fc.bias"] = rng.normal(0, 0.1, 8).astype(np.float32)
            tensors["gradient/fc.weight"] = gradient
            tensors["relu_output_0"] = np.maximum(rng.normal(0, 1, (16, 8)), 0).astype(np.float32)
        writer.begin_step(step, mode, mode_steps[mode])
        mode_steps[mode] += 1
        if mode == ModeKeys.TRAIN:
            train_step += 1
        for name, value in tensors.items():
            writer.add_tensor(name, value, nbytes=value.nbytes)
        writer.end_step()
    writer.write_object(END_OF_TRAINING, b"")
    if not writer.close(timeout=600) or writer.failure is not None:
        raise RuntimeError(f"writing {path} failed: {writer.failure}")
    return time.perf_counter() - started


def _child(run: str, rule: str) -> None:
    """In a fresh process: evaluate one rule on the finished run; print one JSON line."""
    from trainguard.rules import RuleSpec
    from trainguard.rules.runner import RuleRunner
    from trainguard.trial import create_trial

    started = time.perf_counter()
    steps = len(create_trial(run, collection_wait_timeout=0).steps())
    load = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as output:
        wall, cpu = time.perf_counter(), time.process_time()
        final = RuleRunner(run, [RuleSpec(rule)], output_dir=output, poll_interval=0.05).run()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    update = final[rule]
    print(json.dumps({"rule": rule, "steps": steps, "wall_s": wall, "cpu_s": cpu, "index_load_s": load,
                      "status": update.status.value, "details": (update.status_details or "")[:120]}))


def measure(run: str, rule: str, timeout: float) -> dict:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO),
                                                                 os.environ.get("PYTHONPATH", "")])}
    try:
        result = subprocess.run([sys.executable, __file__, "--child", run, rule], capture_output=True, text=True,
                                timeout=timeout, env=environment)
    except subprocess.TimeoutExpired:
        return {"rule": rule, "timeout": timeout}
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        return {"rule": rule, "error": (result.stderr or result.stdout)[-300:]}
    return json.loads(lines[-1])


def debugger_rules() -> list[str]:
    from trainguard.rules import builtin_rules

    return sorted(name for name, rule in builtin_rules().items() if getattr(rule, "kind", "debugger") == "debugger")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", type=int, default=1000, help="saved steps of the short run")
    parser.add_argument("--long", type=int, default=20000, help="saved steps of the long run")
    parser.add_argument("--rules", default="", help="comma-separated rule names (default: every debugger rule)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per rule and run before giving up")
    parser.add_argument("--keep", default="", help="write the runs here (reused when present) instead of a temp dir")
    parser.add_argument("--child", nargs=2, metavar=("RUN", "RULE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
        return
    rules = [name for name in args.rules.split(",") if name] or debugger_rules()
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or scratch
        runs = {}
        for size in (args.short, args.long):
            path = os.path.join(root, f"run-{size}")
            if not os.path.exists(os.path.join(path, "training_job_end.ts")):
                print(f"writing {size} saved steps ... {write_run(path, size):.1f} s", flush=True)
            runs[size] = path
        print(f"{'rule':<30}{'steps/s ' + str(args.short):>16}{'steps/s ' + str(args.long):>16}"
              f"{'ratio':>8}{'cpu ratio':>11}  status (long run)")  # fmt: skip
        failed = []
        for rule in rules:
            rows = {size: measure(path, rule, args.timeout) for size, path in runs.items()}
            short, long = rows[args.short], rows[args.long]
            if "wall_s" not in short or "wall_s" not in long:
                why = {size: row.get("error") or f"timeout {row.get('timeout')} s" for size, row in rows.items()
                       if "wall_s" not in row}
                print(f"{rule:<30} not measured: {why}", flush=True)
                failed.append(rule)
                continue
            rate = {size: row["steps"] / row["wall_s"] for size, row in rows.items()}
            cpu_rate = {size: row["steps"] / max(row["cpu_s"], 1e-9) for size, row in rows.items()}
            ratio = rate[args.long] / rate[args.short]
            cpu_ratio = cpu_rate[args.long] / cpu_rate[args.short]
            if cpu_ratio < 0.9:
                failed.append(rule)
            print(f"{rule:<30}{rate[args.short]:>16.1f}{rate[args.long]:>16.1f}{ratio:>8.2f}{cpu_ratio:>11.2f}  "
                  f"{long['status']} {long['details'][:60]!r}", flush=True)  # fmt: skip
        print(f"below 90 % of the short run's steps per CPU second (or not measured): {', '.join(failed) or 'none'}")


if __name__ == "__main__":
    main()
