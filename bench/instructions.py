"""Instructions the training process executes in its loop, with and without trainguard, counted
by valgrind's callgrind: a figure this shared VM's drift cannot move.

Wall-clock ratios on this machine spread between identical processes by more than the few per
cent issue 15 bounds (bench/RESULTS.md). Callgrind counts every instruction a process executes
(Ir); the stack scripts of bench/stacks/ switch the count on at the start of their timed loop and
off at its end (``BENCH_CALLGRIND_TOGGLE``, a small helper library compiled here with the
system's C compiler against valgrind's headers), so imports, start-up and warm-up are not in it.
Repeated runs of one variant agree (bench/RESULTS.md). What the count leaves out: cycles per
instruction (cache misses, branch mispredictions: interpreter code runs at a lower rate than BLAS
kernels, so an instruction ratio understates a Python-heavy cost somewhat) and other processes:
the writer process and the rule runner are not the training process; their instructions are
reported beside it where callgrind followed them with collection on.

    python bench/instructions.py --stacks mlp --steps 3000
    python bench/instructions.py --stacks mlp cnn --variants plain trainguard trainguard_si1000

Runs take minutes each (callgrind runs the interpreter ~50x slower; importing torch alone takes
about 3 minutes), two at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_stacks import ALL_VARIANTS, STACKS, _environment, command  # noqa: E402

HELPER_SOURCE = """
#include <valgrind/callgrind.h>
void bench_collect_on(void) { CALLGRIND_ZERO_STATS; CALLGRIND_TOGGLE_COLLECT; }
void bench_collect_off(void) { CALLGRIND_TOGGLE_COLLECT; CALLGRIND_DUMP_STATS_AT("loop"); }
"""
_TOTALS = re.compile(r"^totals:\s+([\d ]+)$", re.MULTILINE)
_EVENTS = re.compile(r"^events:\s+(.+)$", re.MULTILINE)
_LOOP_PID = re.compile(r"BENCH_LOOP_PID=(\d+)")


def build_helper(directory: str) -> str:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or shutil.which("valgrind") is None:
        raise SystemExit("bench/instructions.py needs valgrind and a C compiler (apt-get install valgrind gcc)")
    source, library = os.path.join(directory, "toggle.c"), os.path.join(directory, "toggle.so")
    Path(source).write_text(HELPER_SOURCE)
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", library, source], check=True)
    return library


def count(argv: list[str], helper: str, directory: str, cache_sim: bool = False) -> dict[str, int]:
    """Instructions of the loop in the process that ran it ("loop") and in the processes it
    started after the loop began ("children"; a forked writer process inherits the count); with
    ``cache_sim``, the loop's simulated cache misses and branch mispredictions too (callgrind's
    event names: D1mr, DLmr, Bcm...) and its estimated cycles ("cycles")."""
    out = os.path.join(directory, "callgrind.%p")
    valgrind = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--trace-children=yes",
                f"--callgrind-out-file={out}"]  # fmt: skip
    if cache_sim:
        valgrind += ["--cache-sim=yes", "--branch-sim=yes"]
    environment = {**_environment(hash_seed=0), "BENCH_CALLGRIND_TOGGLE": helper}
    run = subprocess.run([*valgrind, *argv], cwd=directory, env=environment, capture_output=True, text=True)
    pid = _LOOP_PID.search(run.stdout)
    if run.returncode != 0 or pid is None:
        raise RuntimeError(f"{' '.join(argv)} exited {run.returncode}:\n{(run.stdout + run.stderr)[-3000:]}")
    loop: dict[str, int] = {}
    children = 0
    for name in os.listdir(directory):
        if not name.startswith("callgrind."):
            continue
        text = Path(directory, name).read_text(errors="replace")
        events = _EVENTS.search(text)
        for totals in _TOTALS.findall(text):
            named = dict(zip(events.group(1).split() if events else ["Ir"], map(int, totals.split()), strict=False))
            if name.split(".")[1] == pid.group(1):
                for event, value in named.items():
                    loop[event] = loop.get(event, 0) + value
            else:
                children += named.get("Ir", 0)
    result = {"loop": loop.get("Ir", 0), "children": children, **saved_steps(directory)}
    if cache_sim:
        result.update(loop)
        result["cycles"] = estimated_cycles(loop)
    return result


def estimated_cycles(events: dict[str, int]) -> int:
    """Callgrind's documented cycle estimate: Ir + 10 x (first-level misses + mispredicted
    branches) + 100 x last-level misses."""
    first_level = sum(events.get(name, 0) for name in ("I1mr", "D1mr", "D1mw"))
    last_level = sum(events.get(name, 0) for name in ("ILmr", "DLmr", "DLmw"))
    mispredicted = events.get("Bcm", 0) + events.get("Bim", 0)
    return events.get("Ir", 0) + 10 * (first_level + mispredicted) + 100 * last_level


def saved_steps(directory: str) -> dict[str, int]:
    """How many steps the run saved, and how many of those more than one tensor (heavy): the
    overhead budget decides by timing, and valgrind's timing is not the machine's."""
    saved = heavy = 0
    for index in Path(directory).glob("trainguard-runs/*/index/*/*.json"):
        saved += 1
        heavy += len(json.loads(index.read_text()).get("tensor_payload", [])) > 1
    return {"saved": saved, "heavy": heavy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", nargs="*", default=["mlp"], choices=list(STACKS))
    parser.add_argument("--variants", nargs="*", default=["plain", "trainguard", "trainguard_si1000"],
                        choices=list(ALL_VARIANTS))  # fmt: skip
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: --scale)")
    parser.add_argument("--scale", type=float, default=0.1, help="steps per run: this share of bench/real_stacks.py's")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--cache-sim", action="store_true",
                        help="also simulate caches and branch prediction (slower): estimated cycles")  # fmt: skip
    parser.add_argument("--keep", metavar="DIR", default=None,
                        help="keep callgrind's files in DIR (for callgrind_annotate)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.keep:
        os.makedirs(args.keep, exist_ok=False)
    with tempfile.TemporaryDirectory(prefix="tg-instructions-") as scratch:
        root = args.keep or scratch
        helper = build_helper(root)
        jobs = []
        for stack in args.stacks:
            steps = args.steps or max(1, int(STACKS[stack][2] * args.scale))
            for variant in args.variants:
                argv_ = command(stack, variant, 1.0)
                argv_[argv_.index("--steps") + 1] = str(steps)
                directory = os.path.join(root, f"{stack}-{variant}")
                os.mkdir(directory)
                jobs.append((stack, variant, steps, argv_, directory))
        with ThreadPoolExecutor(args.parallel) as pool:
            counts = list(pool.map(lambda job: count(job[3], helper, job[4], args.cache_sim), jobs))
    print(render(jobs, counts, args.cache_sim))
    return 0


def render(jobs: list[tuple], counts: list[dict[str, int]], cache_sim: bool) -> str:
    header = ("| stack | steps | variant | loop Ir per step | ratio to plain | saved steps (heavy) "
              "| other processes' Ir per step |")  # fmt: skip
    if cache_sim:
        header += (" est. cycles per step | ratio to plain | L1 misses per step | LL misses per step "
                   "| mispredicted branches per step |")  # fmt: skip
    lines = [header, "|---" * header.count(" | ") + "|---|"]
    plain = {job[0]: c for job, c in zip(jobs, counts, strict=True) if job[1] == "plain"}
    for (stack, variant, steps, *_), c in zip(jobs, counts, strict=True):
        base = plain.get(stack)
        ratio = f"{c['loop'] / base['loop']:.4f}x" if base and base["loop"] else "-"
        row = (f"| {stack} | {steps} | {variant} | {c['loop'] / steps:,.0f} | {ratio} | {c['saved']} ({c['heavy']}) "
               f"| {c['children'] / steps:,.0f} |")  # fmt: skip
        if cache_sim:
            cycles_ratio = f"{c['cycles'] / base['cycles']:.4f}x" if base and base.get("cycles") else "-"
            first = sum(c.get(name, 0) for name in ("I1mr", "D1mr", "D1mw"))
            last = sum(c.get(name, 0) for name in ("ILmr", "DLmr", "DLmw"))
            branches = c.get("Bcm", 0) + c.get("Bim", 0)
            row += (f" {c['cycles'] / steps:,.0f} | {cycles_ratio} | {first / steps:,.0f} | {last / steps:,.0f} "
                    f"| {branches / steps:,.0f} |")  # fmt: skip
        lines.append(row)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
