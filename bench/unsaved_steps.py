"""Hook cost on unsaved steps and on compiled models: the small MLP of bench/stacks/mlp.py
(64-128-128-10, batch 64, Adam, one torch thread), eager and ``torch.compile``d, plain ``python`` vs ``trainguard
run`` with save interval 10 (the default) and 1000 (nearly every step unsaved).

Every run is a fresh process (Dynamo caches and global hooks never leak between variants) running
this file with ``--worker``: after a warm-up (compilation included) it times its steps in blocks
of 50 and prints each block's wall and thread CPU time. On a shared machine most blocks are
slowed by other jobs by different amounts; the 20th percentile of the blocks (and the median,
shown beside it) is what the step costs when the core is the run's own. The variants run back to
back in one round, the order rotated each round; a ratio is taken within a round against the plain
run of the same mode (eager or compiled), then the median over rounds.

    python bench/unsaved_steps.py --reps 5 --steps 2000
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
BLOCK = 50  # steps per timed block: a multiple of the save intervals' 10, so blocks are alike
WARMUP = 20

# name: (mode, save interval or None for plain python, writer (TRAINGUARD_WRITER) or None)
VARIANTS: dict[str, tuple[str, int | None, str | None]] = {
    "eager plain": ("eager", None, None),
    "eager si=10": ("eager", 10, None),
    "eager si=10 thread": ("eager", 10, "thread"),
    "eager si=10 process": ("eager", 10, "process"),
    "eager si=1000": ("eager", 1000, None),
    "compiled plain": ("compiled", None, None),
    "compiled si=10": ("compiled", 10, None),
    "compiled si=10 process": ("compiled", 10, "process"),
    "compiled si=1000": ("compiled", 1000, None),
}


def worker(steps: int, compiled: bool) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model: nn.Module = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    if compiled:
        model = torch.compile(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    inputs, labels = torch.randn(4096, 64), torch.randint(0, 10, (4096,))

    def step(index: int) -> None:
        start = (index * 64) % 4032
        optimizer.zero_grad()
        loss = criterion(model(inputs[start : start + 64]), labels[start : start + 64])
        loss.backward()
        optimizer.step()

    for index in range(WARMUP):
        step(index)
    blocks = []
    for first in range(0, steps, BLOCK):
        wall, cpu = time.perf_counter(), time.thread_time()
        for index in range(first, first + BLOCK):
            step(index)
        blocks.append(((time.perf_counter() - wall) / BLOCK, (time.thread_time() - cpu) / BLOCK))
    print("BENCH_BLOCKS=" + json.dumps(blocks), flush=True)


def command(mode: str, interval: int | None, steps: int, writer: str | None = None) -> list[str]:
    script = [sys.executable, str(Path(__file__).resolve()), "--worker", "--steps", str(steps)]
    if mode == "compiled":
        script.append("--compile")
    if interval is None:
        return script
    runner = [sys.executable, "-m", "trainguard.cli", "run", "--out", "run", "--save-interval", str(interval)]
    if writer is not None:
        runner = ["env", f"TRAINGUARD_WRITER={writer}", *runner]
    return [*runner, "--", *script]


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def run_once(argv: list[str], interval: int | None, steps: int) -> dict[str, float]:
    """Per-step milliseconds of one run in a fresh directory; a trainguard run must have saved
    every step its interval asks for (a hook that failed open would be fast too)."""
    with tempfile.TemporaryDirectory(prefix="tg-unsaved-") as cwd:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
        line = next((x for x in done.stdout.splitlines() if x.startswith("BENCH_BLOCKS=")), None)
        if done.returncode != 0 or line is None:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
        if interval is not None:
            from trainguard.trials import create_trial

            run = os.path.join(cwd, "run")
            expected = list(range(0, steps + WARMUP, interval))
            saved = create_trial(run).steps()
            if saved != expected or os.path.exists(os.path.join(run, "capture_stopped")):
                raise RuntimeError(f"{' '.join(argv)}: saved steps {saved[:5]}... not {expected[:5]}..., or stopped")
    blocks = json.loads(line.split("=", 1)[1])
    walls, cpus = [1000 * wall for wall, _ in blocks], [1000 * cpu for _, cpu in blocks]
    return {"wall_p20": percentile(walls, 0.2), "wall_median": statistics.median(walls),
            "cpu_p20": percentile(cpus, 0.2), "cpu_median": statistics.median(cpus)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS),
                        help="a subset (each with its mode's plain run; eager twins for the last column)")  # fmt: skip
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.steps, args.compile)
        return 0
    steps = max(BLOCK, args.steps // BLOCK * BLOCK)
    names = [name for name in VARIANTS if name in args.variants]
    rows: list[dict] = []
    print(f"load average before: {os.getloadavg()[0]:.1f}", file=sys.stderr)
    for rep in range(args.reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            mode, interval, writer = VARIANTS[name]
            argv = command(mode, interval, steps, writer)
            rows.append({"rep": rep, "variant": name, **run_once(argv, interval, steps)})
            print(f"[rep {rep}] {name:17s} " + "  ".join(f"{k} {rows[-1][k]:.3f}" for k in
                  ("wall_p20", "wall_median", "cpu_p20", "cpu_median")), file=sys.stderr, flush=True)  # fmt: skip
    measures = ("wall_p20", "cpu_p20", "wall_median")
    lines = ["| variant | wall ms/step (p20) | ratio | thread CPU ms/step (p20) | ratio | wall ms/step (median) | "
             "ratio | wall p20 vs eager, same interval |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    table = []
    for name in names:
        mode = VARIANTS[name][0]
        row: dict = {"variant": name}
        for measure in measures:
            by = {(r["rep"], r["variant"]): r[measure] for r in rows}
            row[measure] = statistics.median(by[(rep, name)] for rep in range(args.reps))
            row[f"{measure}_ratio"] = statistics.median(
                by[(rep, name)] / by[(rep, f"{mode} plain")] for rep in range(args.reps)
            )
            twin = name.replace("compiled", "eager")
            if twin in names:
                row[f"{measure}_vs_eager"] = statistics.median(
                    by[(rep, name)] / by[(rep, twin)] for rep in range(args.reps)
                )
        table.append(row)
        lines.append(f"| {name} | " + " | ".join(f"{row[m]:.3f} | {row[m + '_ratio']:.3f}x" for m in measures)
                     + f" | {row.get('wall_p20_vs_eager', float('nan')):.3f}x |")  # fmt: skip
    lines.append(f"\n{args.reps} rounds, {steps} timed steps per run in blocks of {BLOCK}, order rotated; "
                 f"ratios against plain python of the same mode, per round, median over rounds; "
                 f"load average after: {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "table": table}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
