"""Hook cost on unsaved steps and on compiled models: the small MLP (bench/stacks/mlp.py), eager
and ``torch.compile``d, plain ``python`` vs ``trainguard run`` with save interval 10 (the default)
and 1000 (nearly every step unsaved).

Every run is a fresh process (Dynamo caches and global hooks never leak between variants); the
loop's own wall time and the process's CPU time over the loop (writer thread included) are read
from the script (start-up and compilation excluded). On a shared machine CPU time is the
steadier measure of what the hook costs; wall time is what a user sees. The variants run
back to back in one round, the order rotated each round, and a ratio is taken within a round
against the plain run of the same mode (eager or compiled), then the median over rounds.

    python bench/unsaved_steps.py --reps 5 --steps 3000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_TIMES = re.compile(r"BENCH_LOOP_SECONDS=([0-9.]+)\s+BENCH_LOOP_CPU_SECONDS=([0-9.]+)")

# name: (mode, save interval or None for plain python)
VARIANTS: dict[str, tuple[str, int | None]] = {
    "eager plain": ("eager", None),
    "eager si=10": ("eager", 10),
    "eager si=1000": ("eager", 1000),
    "compiled plain": ("compiled", None),
    "compiled si=10": ("compiled", 10),
    "compiled si=1000": ("compiled", 1000),
}


def command(mode: str, interval: int | None, steps: int) -> list[str]:
    script = [sys.executable, "-m", "bench.stacks.mlp", "--steps", str(steps)]
    if mode == "compiled":
        script.append("--compile")
    if interval is None:
        return script
    runner = [sys.executable, "-m", "trainguard.cli", "run", "--out", "run", "--save-interval", str(interval)]
    return [*runner, "--", *script]


def run_once(argv: list[str], interval: int | None, steps: int) -> tuple[float, float]:
    """(loop wall seconds, loop CPU seconds) of one run in a fresh directory; a trainguard run
    must have saved every step its interval asks for (a hook that failed open is fast too)."""
    with tempfile.TemporaryDirectory(prefix="tg-unsaved-") as cwd:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
        match = _TIMES.search(done.stdout)
        if done.returncode != 0 or match is None:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
        if interval is not None:
            from trainguard.trials import create_trial

            run = os.path.join(cwd, "run")
            # 20 warm-up steps run before the timed loop
            expected = list(range(0, steps + 20, interval))
            saved = create_trial(run).steps()
            if saved != expected or os.path.exists(os.path.join(run, "capture_stopped")):
                raise RuntimeError(f"{' '.join(argv)}: saved steps {saved[:5]}... not {expected[:5]}..., or stopped")
    return float(match.group(1)), float(match.group(2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    names = list(VARIANTS)
    rows: list[dict] = []
    for rep in range(args.reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            mode, interval = VARIANTS[name]
            wall_s, cpu_s = run_once(command(mode, interval, args.steps), interval, args.steps)
            rows.append({"rep": rep, "variant": name, "wall_ms": 1000 * wall_s / args.steps,
                         "cpu_ms": 1000 * cpu_s / args.steps})  # fmt: skip
            print(f"[rep {rep}] {name:17s} wall {rows[-1]['wall_ms']:.3f} ms/step  "
                  f"cpu {rows[-1]['cpu_ms']:.3f} ms/step", file=sys.stderr, flush=True)  # fmt: skip
    reps = range(args.reps)
    lines = ["| variant | wall ms/step | wall ratio vs plain (same mode) | CPU ms/step | CPU ratio vs plain "
             "(same mode) | wall ratio vs eager (same interval) | CPU ratio vs eager (same interval) |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    table = []
    for name in names:
        mode, _ = VARIANTS[name]
        row = {"variant": name}
        for measure in ("wall_ms", "cpu_ms"):
            by = {(r["rep"], r["variant"]): r[measure] for r in rows}
            row[measure] = statistics.median(by[(r, name)] for r in reps)
            row[f"{measure}_ratio"] = statistics.median(by[(r, name)] / by[(r, f"{mode} plain")] for r in reps)
            twin = name.replace("compiled", "eager")
            row[f"{measure}_vs_eager"] = statistics.median(by[(r, name)] / by[(r, twin)] for r in reps)
        table.append(row)
        lines.append(f"| {name} | {row['wall_ms']:.3f} | {row['wall_ms_ratio']:.3f}x | {row['cpu_ms']:.3f} | "
                     f"{row['cpu_ms_ratio']:.3f}x | {row['wall_ms_vs_eager']:.3f}x | "
                     f"{row['cpu_ms_vs_eager']:.3f}x |")  # fmt: skip
    lines.append(f"\n{args.reps} rounds of {args.steps} steps per run, order rotated; medians of per-round ratios")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "table": table}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
