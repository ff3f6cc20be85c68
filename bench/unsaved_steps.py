"""Hook cost on unsaved steps and on compiled models: the small MLP (bench/stacks/mlp.py), eager
and ``torch.compile``d, plain ``python`` vs ``trainguard run`` with save interval 10 (the default)
and 1000 (nearly every step unsaved).

Every run is a fresh process (Dynamo caches and global hooks never leak between variants); the
loop's own time is read from the script (start-up and compilation excluded). The variants run
back to back in one round, the order rotated each round, and a ratio is taken within a round
against the plain run of the same mode (eager or compiled), then the median over rounds.

    python bench/unsaved_steps.py --reps 5 --steps 3000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.real_stacks import run_once  # noqa: E402  (one fresh process per run, loop seconds)

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
    return [sys.executable, "-m", "trainguard.cli", "run", "--save-interval", str(interval), "--", *script]


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
            loop_s = run_once(command(mode, interval, args.steps))["loop_s"]
            rows.append({"rep": rep, "variant": name, "ms_per_step": 1000 * loop_s / args.steps})
            print(f"[rep {rep}] {name:17s} {rows[-1]['ms_per_step']:.3f} ms/step", file=sys.stderr, flush=True)
    by = {(row["rep"], row["variant"]): row["ms_per_step"] for row in rows}
    reps = range(args.reps)
    lines = ["| variant | ms/step (median) | ratio vs plain, same mode | ratio vs eager same interval |",
             "|---|---|---|---|"]  # fmt: skip
    table = []
    for name in names:
        mode, interval = VARIANTS[name]
        plain = f"{mode} plain"
        eager_twin = name.replace("compiled", "eager")
        ratio = statistics.median(by[(r, name)] / by[(r, plain)] for r in reps)
        versus_eager = statistics.median(by[(r, name)] / by[(r, eager_twin)] for r in reps)
        median = statistics.median(by[(r, name)] for r in reps)
        table.append({"variant": name, "ms_per_step": median, "ratio": ratio, "vs_eager": versus_eager})
        lines.append(f"| {name} | {median:.3f} | {ratio:.3f}x | {versus_eager:.3f}x |")
    lines.append(f"\n{args.reps} rounds of {args.steps} steps per run; medians of per-round ratios")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "table": table}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
