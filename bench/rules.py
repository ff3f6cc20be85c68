"""Rule benchmarks: can the default rules keep up with capture, and how fast does auto-stop stop?

(a) Throughput. A mid-size PyTorch model (MLP 784-512-512-256-10 with ReLU modules, batch 128)
    trains under the hook with every step saved (the default rules' collections: weights,
    gradients, losses, outputs, relu activations ...). Reported: training steps/s with capture,
    and the default rule set's evaluation rate (steps/s) on that run with the live runner, in
    one process after training (so the two do not compete for the cores), plus each rule alone.
(b) One-machine detection latency. ``trainguard run --rules --stop-on-issue`` on
    examples/faulty/exploding_lr.py, N times: time from the faulty step's index file being
    written (its mtime) to the training process group being gone (``trainguard-stop.json``).

    python bench/rules.py                 # both, 10 latency runs
    python bench/rules.py --runs 20 --steps 80
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def capture_run(out_dir: str, steps: int) -> dict[str, float]:
    import torch
    import torch.nn as nn

    import trainguard.pytorch as tg
    from trainguard.rules import builtin_rules
    from trainguard.rules.defaults import BASE_COLLECTIONS, DEFAULT_RULES, rule_collections

    torch.manual_seed(0)
    torch.set_num_threads(1)
    classes = [builtin_rules()[name] for name in DEFAULT_RULES if name in builtin_rules()]
    # the XGBoost rules' collections (trees, feature importances) do not exist for a PyTorch model;
    # those rules report "not evaluated" here, as under `trainguard run --rules`
    collections = [
        name for name in dict.fromkeys([*BASE_COLLECTIONS, *rule_collections(classes)])
        if name not in ("trees", "feature_importance")
    ]  # fmt: skip

    def model() -> nn.Module:
        return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                             nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))  # fmt: skip

    data = torch.randn(steps * 128, 784)
    labels = torch.randint(0, 10, (steps * 128,))

    def train(hooked: bool) -> tuple[float, float]:
        net = model()
        criterion = nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        hook = None
        if hooked:
            hook = tg.Hook(out_dir, save_config=tg.SaveConfig(save_interval=1), include_collections=collections)
            hook.register_module(net)
            hook.register_loss(criterion)
        started, cpu_started = time.perf_counter(), time.process_time()
        for step in range(steps):
            x, y = data[step * 128 : (step + 1) * 128], labels[step * 128 : (step + 1) * 128]
            optimizer.zero_grad()
            loss = criterion(net(x), y)
            loss.backward()
            optimizer.step()
        if hook is not None:
            hook.close()
        return steps / (time.perf_counter() - started), steps / (time.process_time() - cpu_started)

    plain, _ = train(False)
    captured, captured_cpu = train(True)
    return {
        "plain_steps_per_s": plain,
        "captured_steps_per_s": captured,
        "captured_steps_per_cpu_s": captured_cpu,
        "parameters": sum(p.numel() for p in model().parameters()),
    }


def evaluate_rate(run: str, names: list[str]) -> tuple[float, float]:
    """Steps per wall second and per CPU second (all threads of this process)."""
    from trainguard.rules import RuleSpec
    from trainguard.rules.runner import RuleRunner
    from trainguard.trial import create_trial

    steps = len(create_trial(run, collection_wait_timeout=0).steps())
    with tempfile.TemporaryDirectory() as output:
        started, cpu_started = time.perf_counter(), time.process_time()
        final = RuleRunner(run, [RuleSpec(name) for name in names], output_dir=output, poll_interval=0.05).run()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    errors = {
        name: u.status_details
        for name, u in final.items()
        if u.status.value == "Error" and not str(u.status_details).startswith("RuleNotEvaluated:")
    }
    if errors:
        raise RuntimeError(f"rules failed: {errors}")
    return steps / elapsed, steps / cpu


def latency_runs(runs: int, out_root: Path) -> list[dict[str, float]]:
    samples = []
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    for index in range(runs):
        out = out_root / f"faulty-{index}"
        started = time.time()
        result = subprocess.run(
            [sys.executable, "-m", "trainguard.cli", "run", "--out", str(out), "--rules", "--stop-on-issue", "--",
             sys.executable, str(REPO / "examples/faulty/exploding_lr.py")],
            env=environment, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if result.returncode != 3:
            raise RuntimeError(
                f"run {index}: expected exit 3 (stopped), got {result.returncode}:\n{result.stderr[-2000:]}"
            )
        record = json.loads((out / "trainguard-stop.json").read_text())
        index_file = next((out / "index").glob(f"*/{int(record['step']):012d}_*.json"))
        written = index_file.stat().st_mtime
        samples.append(
            {
                "step": record["step"],
                "rule": record["configuration_name"],
                "detect_s": record["finding_reported_at"] - written,
                "stop_s": record["stopped_at"] - written,
                "run_s": time.time() - started,
            }
        )
        print(f"  run {index}: {samples[-1]}", flush=True)
    return samples


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[int(q) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60, help="training steps captured for (a)")
    parser.add_argument("--runs", type=int, default=10, help="auto-stop runs for (b)")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()

    from trainguard.rules import builtin_rules
    from trainguard.rules.defaults import DEFAULT_RULES

    names = [name for name in DEFAULT_RULES if name in builtin_rules()]
    with tempfile.TemporaryDirectory() as scratch:
        if not args.skip_throughput:
            run = os.path.join(scratch, "capture")
            rates = capture_run(run, args.steps)
            print(f"(a) model: {rates['parameters']:,} parameters, {args.steps} steps, every step saved")
            print(f"    training without capture : {rates['plain_steps_per_s']:.1f} steps/s")
            print(f"    training with capture    : {rates['captured_steps_per_s']:.1f} steps/s "
                  f"({rates['captured_steps_per_cpu_s']:.1f} per CPU second)")  # fmt: skip
            together, together_cpu = evaluate_rate(run, names)
            print(f"    default rules ({len(names)}) eval : {together:.1f} steps/s "
                  f"= {together / rates['captured_steps_per_s']:.2f}x the capture rate "
                  f"({together_cpu:.1f} per CPU second = "
                  f"{together_cpu / rates['captured_steps_per_cpu_s']:.2f}x capture's)")  # fmt: skip
            for name in names:
                print(f"      {name:<26} {evaluate_rate(run, [name])[0]:8.1f} steps/s alone", flush=True)
        if not args.skip_latency:
            samples = latency_runs(args.runs, Path(scratch))
            for key, label in (
                ("detect_s", "fault step written -> finding"),
                ("stop_s", "fault step written -> stopped"),
            ):
                values = [sample[key] for sample in samples]
                print(f"(b) {label}: p50 {percentile(values, 50):.3f} s, p95 {percentile(values, 95):.3f} s, "
                      f"max {max(values):.3f} s (n={len(values)})")  # fmt: skip
            print(
                f"    fired at step(s) {sorted({s['step'] for s in samples})} "
                f"by {sorted({s['rule'] for s in samples})}; "
                f"wall per run p50 {statistics.median(s['run_s'] for s in samples):.1f} s of a 1920-step script"
            )


if __name__ == "__main__":
    main()
