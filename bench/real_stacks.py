"""Overhead on stacks users run: plain ``python`` vs ``trainguard run`` vs ``trainguard run --rules``.

Each stack is a training script in bench/stacks/ (a small ~1 ms-step MLP, the same compiled with
torch.compile, the reference CNN, a Hugging Face ``Trainer`` on a tiny BERT built from a config,
PyTorch Lightning ``Trainer.fit``), sized so that its training loop runs about 30 s on a quiet
2-core machine. By default (``--schedule turns``) the variants of one stack run at the same time,
taking turns of one second each (bench/time_slices.py: only one variant's process tree runs at a
time), so that the machine's drift hits all of them alike; ``--schedule sequential`` runs them
back to back instead, their order rotated each repetition. Ratios are taken within one
repetition and their median reported. Measured per run: the loop's own time (its span printed by
the script, start-up excluded; with turns, the variant's own turns within that span), the whole
command's time (start-up, capture flush and the rule runner's finish included) and the peak RSS
of the largest process of the run (``wait4``: the training process under ``trainguard run``).

``--load`` adds a condition with the other core kept busy (one spinning process, as a
data-loader worker would), measured after the quiet one in the same invocation.

    python bench/real_stacks.py                                  # quiet and loaded, 1 repetition
    python bench/real_stacks.py --reps 3 --stacks mlp compiled_mlp --scale 0.3     # ~10 s loops
    python bench/real_stacks.py --quick                          # seconds per run: a smoke test
    python bench/real_stacks.py --stacks cnn --baseline-tree /tmp/base   # this code vs another checkout's
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from time_slices import run_in_turns  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STACKS: dict[str, tuple[str, list[str], int]] = {
    # name: (module, extra arguments, steps for a >= 30 s plain loop on a quiet machine; the loop
    # times measured are in the notes of bench/RESULTS.md's real-stacks rows)
    "mlp": ("bench.stacks.mlp", [], 87500),
    "compiled_mlp": ("bench.stacks.mlp", ["--compile"], 75000),
    "cnn": ("bench.stacks.cnn", [], 2800),
    "hf_trainer": ("bench.stacks.hf_trainer", [], 3360),
    "lightning": ("bench.stacks.lightning_fit", [], 61250),
}
# steps for about 10 s of loop on one H100 (its kernels are quick: per-step Python dominates)
CUDA_STEPS = {"mlp": 30000, "compiled_mlp": 30000, "cnn": 10000, "hf_trainer": 800, "lightning": 10000}
VARIANTS = ("plain", "trainguard", "trainguard_rules")
# more variants, on request (--variants): the default run with one writer or the other
WRITER_VARIANTS = {"trainguard_thread": "thread", "trainguard_process": "process"}
# ...and other trainguard run options: nearly every step unsaved; live rules on every 10th step
OPTION_VARIANTS = {
    "trainguard_si1000": ["--save-interval", "1000"],
    # four times si1000's saves: whether what si1000 adds over save_once grows with the saves
    "trainguard_si250": ["--save-interval", "250"],
    # step 0 saved, then nothing: the process carries the hook and the writer, and pays only
    # the unsaved-step path (what si1000's few heavy saves add is the difference to it)
    "trainguard_save_once": ["--save-interval", str(10**9)],
    "trainguard_rules_dense": ["--rules", "--overhead-budget", "0"],
    # where the overhead budget ends on a fast step (losses every 100 steps, the rest every 500),
    # fixed from the start: the default run's steady state without its timing-driven decisions
    "trainguard_budget_caps": ["--config", str(Path(__file__).resolve().parent / "budget_caps.json")],
}
# ...and `--rules` with its rule runner at normal priority instead of as batch work (nice 5)
ENV_VARIANTS = {
    "trainguard_rules_nice0": ("TRAINGUARD_RULES_NICE=0", ["--rules"]),
    "trainguard_si1000_thread": ("TRAINGUARD_WRITER=thread", ["--save-interval", "1000"]),
}
# ...and, to tell what a hook costs from what its process carries: the script without any hook
# but with trainguard's hook modules imported first (memory and code layout, no capture)
IMPORT_ONLY = "no_hook_trainguard_imported"
# ...and the script as a child of a waiting parent, nothing of trainguard: what timing a process
# tree (trainguard run -> training) in turns against a single process adds by itself
TREE_ONLY = "parent_and_plain_child"
# Plain processes whose allocation history is moved (--layout-controls): one that merely allocates
# a little more before its model (as a hooked one does) lands its tensors elsewhere and runs apart
# from identical ones by more than the overheads to measure (bench/RESULTS.md, "What the clock
# resolves"). These are plain python, not in the baseline; they show how far a different layout
# alone moves the ratio.
LAYOUT_CONTROL_PREFIX = "layout_control_"
LAYOUT_SHIFT_MAX = 200_000  # bytes allocated first, at most
ENVIRONMENT_PAD_MAX = 4096  # bytes of environment added, at most (the stack's alignment, page offset)
ALL_VARIANTS = (*VARIANTS, *WRITER_VARIANTS, *OPTION_VARIANTS, *ENV_VARIANTS, IMPORT_ONLY, TREE_ONLY)
# glibc (mallopt(3)): never give freed heap back to the kernel, serve up to 32 MiB from the heap
FIXED_MALLOC = {"MALLOC_TRIM_THRESHOLD_": str(2**32), "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20)}
_LOOP = re.compile(r"BENCH_LOOP_SECONDS=([0-9.]+)")
# the training process's own CPU seconds over its loop (user + kernel; bench/stacks/_timing.py)
# (and its kernel seconds and minor page faults, where the allocator's luck shows)
_LOOP_USAGE = re.compile(r"BENCH_LOOP_USAGE=user ([0-9.]+) sys ([0-9.]+) minflt ([0-9]+)")


# Identical processes differ here by more than the overheads to measure (heap and code layout,
# which no seed fixes; bench/RESULTS.md), so a single plain process per repetition would carry all
# of that into every ratio: --plain-copies runs several, and each repetition's baseline is their mean.
PLAIN_COPY_PREFIX = "plain_"

BASELINE_SUFFIX = "@base"  # a variant run with the trainguard of --baseline-tree


def command(
    stack: str,
    variant: str,
    scale: float,
    device: str = "cpu",
    baseline: Path | None = None,
    rep: int = 0,
    shift_layouts: bool = False,
) -> list[str]:
    argv = _command(stack, variant, scale, device, baseline, rep, shift_layouts)
    if not shift_layouts or variant.endswith(BASELINE_SUFFIX):
        return argv  # (X@base runs X's command, padded as X's is)
    # The stack too: the environment's size moves where the initial stack (and every C frame
    # on it) lies, which moves run times by percents as heap layouts do (Mytkowicz et al., ASPLOS
    # 2009), and trainguard run's child always has a few variables more than a plain process.
    # A pad of its own per process, inherited by trainguard run's training process.
    pad = random.Random(f"{variant}/{rep}/environment").randrange(0, ENVIRONMENT_PAD_MAX)
    return ["env", f"BENCH_ENVIRONMENT_PAD={'x' * pad}", *argv]


def _command(
    stack: str,
    variant: str,
    scale: float,
    device: str,
    baseline: Path | None,
    rep: int,
    shift_layouts: bool,
) -> list[str]:
    if variant.endswith(BASELINE_SUFFIX):
        # the same variant, with another checkout's trainguard first on the path (the stack
        # scripts still come from this one): two versions of the code in one interleaved run
        if baseline is None:
            raise ValueError(f"variant {variant} needs --baseline-tree")
        path = os.pathsep.join([str(baseline / "src"), str(REPO)])
        unversioned = variant.removesuffix(BASELINE_SUFFIX)
        inner = command(stack, unversioned, scale, device, rep=rep, shift_layouts=shift_layouts)
        return ["env", f"PYTHONPATH={path}", *inner]
    module, extra, steps = STACKS[stack]
    if device == "cuda":
        steps, extra = CUDA_STEPS[stack], [*extra, "--device", "cuda"]
    script = [sys.executable, "-m", module, "--steps", str(max(1, int(steps * scale))), *extra]
    runner = [sys.executable, "-m", "trainguard.cli", "run"]
    if variant.startswith(LAYOUT_CONTROL_PREFIX) or (shift_layouts and variant != IMPORT_ONLY):
        # --shift-layouts: every process of the run, plain or hooked, draws a layout of its own,
        # so that the baseline is not one fixed draw of the lottery the hooked processes play
        script = _script_after(_layout_shift(variant, rep), module, script)
    if is_plain(variant) or variant.startswith(LAYOUT_CONTROL_PREFIX):
        return script
    if variant == IMPORT_ONLY:
        first = (_layout_shift(variant, rep) + "; " if shift_layouts else "") + "import trainguard.hooks.zero_code"
        return _script_after(first, module, script)
    if variant == TREE_ONLY:
        return [sys.executable, "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))", *script]
    if variant == "trainguard":
        return [*runner, "--", *script]
    if variant in WRITER_VARIANTS:
        return ["env", f"TRAINGUARD_WRITER={WRITER_VARIANTS[variant]}", *runner, "--", *script]
    if variant in OPTION_VARIANTS:
        return [*runner, *OPTION_VARIANTS[variant], "--", *script]
    if variant in ENV_VARIANTS:
        setting, options = ENV_VARIANTS[variant]
        return ["env", setting, *runner, *options, "--", *script]
    return [*runner, "--rules", "--", *script]


def _layout_shift(variant: str, rep: int) -> str:
    """Python that moves the process's allocation history before its model by a size of its own per
    variant and repetition (the same on every run of the benchmark)."""
    shift = random.Random(f"{variant}/{rep}").randrange(1, LAYOUT_SHIFT_MAX)
    return f"_moved = bytearray({shift}); import torch; _tensors = [torch.empty({shift // 4 + 1}) for _ in range(3)]"


def is_plain(variant: str) -> bool:
    """``plain`` and its copies (``plain_2``...): the script without trainguard."""
    return variant == "plain" or variant.startswith(PLAIN_COPY_PREFIX)


def _script_after(first: str, module: str, script: list[str]) -> list[str]:
    """The stack script ``python -m module ...`` run in a process that executes ``first`` before it."""
    run = f"import runpy, sys; {first}; sys.argv[0] = {module!r}; runpy.run_module({module!r}, run_name='__main__')"
    return [sys.executable, "-c", run, *script[3:]]


def is_layout_control(variant: str) -> bool:
    return variant.startswith(LAYOUT_CONTROL_PREFIX)


def layout_controls(count: int) -> tuple[str, ...]:
    return tuple(f"{LAYOUT_CONTROL_PREFIX}{number}" for number in range(1, count + 1))


def plain_copies(count: int) -> tuple[str, ...]:
    return ("plain", *(f"{PLAIN_COPY_PREFIX}{number}" for number in range(2, count + 1)))


def _environment(hash_seed: int | None = None) -> dict[str, str]:
    # This checkout's own src first: with trainguard installed editable from another checkout
    # (the usual set-up), a benchmark run from a git worktree would otherwise time that one's code
    path = [str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH")]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    if hash_seed is not None:
        # Python's string hashing lays out every dict, so a random seed per process moves identical
        # processes apart (bench/RESULTS.md). One seed for all variants of a repetition, another
        # for the next: the variants differ by what they run, not by luck.
        environment["PYTHONHASHSEED"] = str(hash_seed)
    return environment


def run_in_turns_once(
    argvs: dict[str, list[str]], slice_seconds: float, hash_seed: int | None = None
) -> dict[str, dict[str, float]]:
    """Every variant's loop seconds (its own turns within its loop), command seconds (all its
    turns) and peak RSS, run at the same time taking turns, each in a fresh directory."""
    with tempfile.TemporaryDirectory(prefix="tg-stacks-") as root:
        cwd_of = {name: os.path.join(root, name) for name in argvs}
        for cwd in cwd_of.values():
            os.mkdir(cwd)
        runs = run_in_turns(argvs, cwd_of=cwd_of, env=_environment(hash_seed), slice_seconds=slice_seconds)
        results = {}
        for name, run in runs.items():
            span = run.loop_span()
            if run.returncode != 0 or span is None:
                raise RuntimeError(f"{' '.join(run.argv)} exited {run.returncode}:\n{run.text()[-3000:]}")
            text = run.text()
            results[name] = {"loop_s": run.active_seconds(*span), "command_s": run.active_seconds(),
                             "loop_cpu_s": _loop_cpu_seconds(text), "peak_rss_mib": run.peak_rss_mib,
                             **_loop_faults(text)}  # fmt: skip
        return results


def _loop_faults(text: str) -> dict[str, float]:
    """The loop's kernel seconds and minor page faults in the training process: glibc returns
    freed heap to the kernel and faults it back in, which costs a plain CNN process more than the
    hook costs a hooked one (bench/RESULTS.md)."""
    match = _LOOP_USAGE.search(text)
    return {"loop_sys_s": float(match.group(2)), "loop_minflt": int(match.group(3))} if match else {}


def _loop_cpu_seconds(text: str) -> float | None:
    """The training process's CPU seconds in its loop: unlike its turns' wall time, blind to
    whatever keeps it off the CPU while its turn runs (other processes of its tree, the harness)."""
    match = _LOOP_USAGE.search(text)
    return float(match.group(1)) + float(match.group(2)) if match else None


def run_once(argv: list[str], hash_seed: int | None = None) -> dict[str, float]:
    """Loop seconds, command seconds and peak RSS (MiB) of one run in a fresh directory."""
    with tempfile.TemporaryDirectory(prefix="tg-stack-") as cwd:
        env = _environment(hash_seed)
        started = time.perf_counter()
        with tempfile.TemporaryFile(mode="w+") as out:
            process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
            elapsed = time.perf_counter() - started
            out.seek(0)
            text = out.read()
    match = _LOOP.search(text)
    if process.returncode != 0 or match is None:
        raise RuntimeError(f"{' '.join(argv)} exited {process.returncode}:\n{text[-3000:]}")
    return {"loop_s": float(match.group(1)), "command_s": elapsed, "loop_cpu_s": _loop_cpu_seconds(text),
            "peak_rss_mib": usage.ru_maxrss / 1024, **_loop_faults(text)}  # fmt: skip


def measure(
    stacks: list[str],
    reps: int,
    scale: float,
    condition: str,
    device: str = "cpu",
    variants: tuple[str, ...] = VARIANTS,
    slice_seconds: float | None = 1.0,
    baseline: Path | None = None,
    shift_layouts: bool = False,
    first_rep: int = 0,
) -> list[dict]:
    """Every variant of every stack, ``reps`` times; ``slice_seconds`` None runs the variants
    back to back instead of at once in turns. Repetition ``first_rep + i`` draws the hash seed and
    layouts of that number: a later invocation with ``first_rep`` past an earlier one's
    repetitions adds new draws, not the same ones again."""
    rows = []
    for rep in range(first_rep, first_rep + reps):
        for stack in stacks:
            order = variants[rep % len(variants) :] + variants[: rep % len(variants)]
            try:
                if slice_seconds is None:
                    results = {
                        variant: run_once(command(stack, variant, scale, device, baseline, rep, shift_layouts), rep)
                        for variant in order
                    }
                else:
                    argvs = {
                        variant: command(stack, variant, scale, device, baseline, rep, shift_layouts)
                        for variant in order
                    }
                    results = run_in_turns_once(argvs, slice_seconds, hash_seed=rep)
            except RuntimeError as error:  # one broken stack must not cost the others' figures
                print(f"[{condition} rep {rep}] {stack} FAILED: {error}", file=sys.stderr, flush=True)
                continue
            for variant in order:
                result = results[variant]
                rows.append({"condition": condition, "rep": rep, "stack": stack, "variant": variant, **result})
                print(f"[{condition} rep {rep}] {stack:13s} {variant:17s} loop {result['loop_s']:7.2f} s  "
                      f"command {result['command_s']:7.2f} s  peak RSS {result['peak_rss_mib']:6.0f} MiB  "
                      f"loop kernel {result.get('loop_sys_s', float('nan')):5.2f} s  "
                      f"page faults {result.get('loop_minflt', -1)}", file=sys.stderr, flush=True)  # fmt: skip
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    table = []
    keys = sorted({(r["condition"], r["stack"]) for r in rows}, key=lambda k: (k[0] != "quiet", k[1]))
    for condition, stack in keys:
        mine = [r for r in rows if r["condition"] == condition and r["stack"] == stack]
        by = {(r["rep"], r["variant"]): r for r in mine}
        reps = sorted({r["rep"] for r in mine})
        if not reps:
            continue
        copies = [variant for variant in dict.fromkeys(r["variant"] for r in mine) if is_plain(variant)]
        baseline = {
            rep: {key: statistics.fmean(by[(rep, copy)][key] for copy in copies) for key in ("loop_s", "command_s")}
            for rep in reps
        }
        # every plain process of a repetition, its copies and its moved layouts: the middle one
        plains = [
            variant
            for variant in dict.fromkeys(r["variant"] for r in mine)
            if is_plain(variant) or is_layout_control(variant)
        ]
        any_layout = {rep: statistics.median(by[(rep, plain)]["loop_s"] for plain in plains) for rep in reps}
        for variant in dict.fromkeys(r["variant"] for r in mine):
            runs = [by[(rep, variant)] for rep in reps]
            ratios = [r["loop_s"] / baseline[rep]["loop_s"] for r, rep in zip(runs, reps, strict=True)]
            command_ratios = [r["command_s"] / baseline[rep]["command_s"] for r, rep in zip(runs, reps, strict=True)]
            layout_ratios = [r["loop_s"] / any_layout[rep] for r, rep in zip(runs, reps, strict=True)]
            cpu_ratios = _cpu_ratios(by, runs, reps, copies)
            table.append({
                "condition": condition, "stack": stack, "variant": variant,
                "loop_s": statistics.median(r["loop_s"] for r in runs),
                "loop_ratio": statistics.median(ratios),
                "loop_ratio_min": min(ratios), "loop_ratio_max": max(ratios),
                "loop_ratio_mean": statistics.fmean(ratios), "loop_ratio_ci95": _half_width_95(ratios),
                "layout_ratio": statistics.median(layout_ratios) if len(plains) > len(copies) else None,
                "cpu_ratio_mean": statistics.fmean(cpu_ratios) if cpu_ratios else None,
                "cpu_ratio_ci95": _half_width_95(cpu_ratios) if cpu_ratios else None,
                "command_s": statistics.median(r["command_s"] for r in runs),
                "command_ratio": statistics.median(command_ratios),
                "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
            })  # fmt: skip
    return table


def _cpu_ratios(by: dict, runs: list[dict], reps: list[int], copies: list[str]) -> list[float]:
    """Per repetition, the training process's loop CPU seconds over the plain copies' mean; empty
    where a run printed none (an older stack script)."""
    ratios = []
    for run, rep in zip(runs, reps, strict=True):
        plain = [by[(rep, copy)].get("loop_cpu_s") for copy in copies]
        if run.get("loop_cpu_s") is None or None in plain:
            return []
        ratios.append(run["loop_cpu_s"] / statistics.fmean(plain))
    return ratios


def _half_width_95(values: list[float]) -> float | None:
    """Half the width of the mean's 95 % confidence interval (Student's t), None below 3 values.

    With --shift-layouts every process is its own layout draw, and the repetitions' ratios are
    independent samples of the hooked/plain ratio: their mean and this interval say how well
    many repetitions pinned it down, which a median and a range do not."""
    if len(values) < 3:
        return None
    # two-sided 97.5 % quantiles of Student's t for 2..30 degrees of freedom; 1.96 beyond
    quantiles = {2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
                 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042}  # fmt: skip
    freedom = len(values) - 1
    quantile = next((quantiles[d] for d in sorted(quantiles) if d >= freedom), 1.96)
    return quantile * statistics.stdev(values) / math.sqrt(len(values))


def render(table: list[dict], reps: int) -> str:
    layouts = any(row.get("layout_ratio") is not None for row in table)
    lines = ["| condition | stack | variant | loop s | loop ratio | loop ratio range | mean ratio (95 % CI) | "
             + ("vs every plain layout | " if layouts else "") + "training CPU, mean ratio (95 % CI) | command s | "
             "command ratio | peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if layouts else "")]  # fmt: skip
    for row in table:
        layout = f"{row['layout_ratio']:.3f}x | " if row.get("layout_ratio") is not None else "- | " if layouts else ""
        half = row.get("loop_ratio_ci95")
        mean = f"{row['loop_ratio_mean']:.3f}x" + (f" +- {half:.3f}" if half is not None else "")
        cpu_half = row.get("cpu_ratio_ci95")
        cpu = "-" if row.get("cpu_ratio_mean") is None else (
            f"{row['cpu_ratio_mean']:.3f}x" + (f" +- {cpu_half:.3f}" if cpu_half is not None else ""))  # fmt: skip
        lines.append(f"| {row['condition']} | {row['stack']} | {row['variant']} | {row['loop_s']:.2f} | "
                     f"{row['loop_ratio']:.3f}x | {row['loop_ratio_min']:.3f}-{row['loop_ratio_max']:.3f} | {mean} | "
                     f"{layout}{cpu} | "
                     f"{row['command_s']:.2f} | {row['command_ratio']:.3f}x | "
                     f"{row['peak_rss_mib']:.0f} |")  # fmt: skip
    lines.append(f"\nmedians over {reps} repetition(s); ratios against plain python within each repetition (the "
                 "mean of its plain copies where there are several; a copy's own ratio shows the spread of "
                 "identical processes)"
                 + ("; vs every plain layout: against the median of all plain processes of the repetition, its "
                    "copies and its layout controls (plain python that allocates some bytes before its model)"
                    if layouts else ""))  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", nargs="*", default=list(STACKS), choices=list(STACKS))
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--first-rep", type=int, default=0,
                        help="number the repetitions from here (each number its own hash seed and layouts): "
                        "more repetitions in a later run, e.g. --first-rep 5 after --reps 5")  # fmt: skip
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every stack's steps")
    parser.add_argument("--load", choices=["no", "yes", "only"], default="yes",
                        help="also (yes) or only (only) measure with the other core kept busy")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="1%% of the steps: checks the harness, not speed")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: every stack on the GPU, CUDA_STEPS steps (use with --load no)")  # fmt: skip
    parser.add_argument("--fixed-malloc", action="store_true",
                        help="every process with glibc's heap trimming off and its mmap threshold fixed: the "
                        "hook's own cost without the allocator's luck (plain CNN processes otherwise fault their "
                        "freed activations back in, and a hooked process, whose allocations keep the heap from "
                        "shrinking, runs faster than they do)")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the runs and the table here")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(ALL_VARIANTS),
                        help="plain is always run (ratios are against it)")  # fmt: skip
    parser.add_argument(
        "--plain-copies",
        type=int,
        default=1,
        help="plain processes per repetition, their mean the baseline (plain_2... in the table)",
    )
    parser.add_argument("--layout-controls", type=int, default=0,
                        help="plain processes per repetition that allocate 1-200,000 bytes before their model "
                        "(layout_control_1...): how far a different memory layout alone moves a ratio")  # fmt: skip
    parser.add_argument("--shift-layouts", action="store_true",
                        help="every process, plain copies and trainguard variants alike, allocates 1-200,000 bytes "
                        "before its model and runs with 0-4,095 bytes more environment (its own sizes per variant "
                        "and repetition): ratios over many repetitions then average over heap and stack layouts "
                        "instead of comparing with one fixed plain layout")  # fmt: skip
    parser.add_argument("--schedule", choices=["turns", "sequential"], default="turns",
                        help="turns: a stack's variants at once, one running at a time (bench/time_slices.py); "
                        "sequential: one after the other")  # fmt: skip
    parser.add_argument("--slice", type=float, default=1.0, help="seconds per turn (--schedule turns)")
    parser.add_argument("--baseline-tree", type=Path,
                        help="another checkout (e.g. git worktree add /tmp/base HEAD~1): every trainguard variant "
                        "also runs with its code, as <variant>@base, in the same turns")  # fmt: skip
    args = parser.parse_args(argv)
    if args.fixed_malloc:
        # inherited by every process of every variant (trainguard run passes its environment on)
        os.environ.update(FIXED_MALLOC)
    slice_seconds = args.slice if args.schedule == "turns" else None
    if args.plain_copies < 1:
        parser.error("--plain-copies must be 1 or more")
    if args.layout_controls < 0:
        parser.error("--layout-controls must be 0 or more")
    if args.first_rep < 0:
        parser.error("--first-rep must be 0 or more (it is each repetition's PYTHONHASHSEED)")
    variants = tuple(
        dict.fromkeys([*plain_copies(args.plain_copies), *layout_controls(args.layout_controls), *args.variants])
    )
    if args.baseline_tree is not None:
        if not (args.baseline_tree / "src" / "trainguard").is_dir():
            parser.error(f"--baseline-tree {args.baseline_tree} holds no src/trainguard")
        variants += tuple(f"{variant}{BASELINE_SUFFIX}" for variant in variants if not is_plain(variant))
    scale = 0.01 if args.quick else args.scale
    conditions = {"no": ["quiet"], "yes": ["quiet", "loaded"], "only": ["loaded"]}[args.load]
    print(f"load average before: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    rows: list[dict] = []
    for condition in conditions:
        spinner = None
        if condition == "loaded":
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            baseline = args.baseline_tree.resolve() if args.baseline_tree else None
            rows += measure(
                args.stacks, args.reps, scale, condition, args.device, variants, slice_seconds, baseline,
                args.shift_layouts, args.first_rep,
            )  # fmt: skip
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    table = summarise(rows)
    print(render(table, args.reps))
    print(f"load average after: {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs; trainguard run's default "
          f"save interval; torch threads 1; schedule {args.schedule}", file=sys.stderr)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "table": table}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
