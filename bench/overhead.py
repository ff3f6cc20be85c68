"""Training-step overhead of trainguard's hook versus smdebug 1.0.34's, on the same CPU workloads.

    python bench/overhead.py                 # full run (3 rounds; about 15-20 min on 2 cores)
    python bench/overhead.py --quick         # smoke run: 1 round, few steps
    python bench/overhead.py --markdown      # also print a markdown table (record figures: bench/results_table.py)
    python bench/overhead.py --impls smdebug # one side only (e.g. before trainguard's hook exists)

Each measurement is a fresh process running bench/_overhead_worker.py: trainguard workers use this
interpreter with the repo's src/ on PYTHONPATH; smdebug workers use the cached smdebug venv
(tests/interop/smdebug_env.py; built on first use). The two interpreters differ (numpy 1.26 and
protobuf 3.20.3 in the smdebug venv), so a hook is never compared with the other interpreter's
bare loop: slowdown = hooked median step time / no-hook median step time of the SAME
interpreter, measured in the same round (the no-hook baseline runs at the start and the end of
each model's block; their mean is used).

Rounds interleave everything (baselines, configurations, implementations; orders alternate
between rounds) so that slow phases of a noisy machine hit both implementations alike. The
reported slowdown is the median over rounds.

Columns:
  slowdown (median)  ratio of median step times: the typical step. With save intervals >1
                     most steps save nothing, so this shows the per-step bookkeeping cost.
  slowdown (mean)    ratio of mean step times: includes the saving steps, amortized.
  tg/smd overhead    (tg - 1) / (smd - 1) on the median slowdowns: trainguard's overhead as a
                     fraction of smdebug's (n/a when smdebug's overhead is below 2%, where the
                     fraction would be noise).
  bytes              bytes under out_dir after hook.close().
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "bench" / "_overhead_worker.py"
sys.path.insert(0, str(REPO / "tests" / "interop"))

from smdebug_env import ensure_smdebug_venv  # noqa: E402

HOOK_CONFIGS = [
    "all_every_1",
    "all_every_10",
    "all_every_100",
    "all_every_500",
    "wbgl_every_10",
    "reductions_every_1",
]
# Timed steps per configuration: enough that every interval config saves several times
# (interval 500 over 2500 steps saves 5 times) while the every-step "save everything" config
# (about 18 MB per step for the CNN) stays within disk and time.
STEPS = {
    "none": 300,
    "all_every_1": 30,
    "all_every_10": 300,
    "all_every_100": 1000,
    "all_every_500": 2500,
    "wbgl_every_10": 300,
    "reductions_every_1": 200,
}
QUICK_STEPS = {
    "none": 100,
    "all_every_1": 5,
    "all_every_10": 30,
    "all_every_100": 200,
    "all_every_500": 1000,
    "wbgl_every_10": 30,
    "reductions_every_1": 30,
}
INTERP_OF = {"trainguard": "trainguard", "smdebug": "smdebug"}  # impl -> interpreter


def interpreters(impls):
    """Command prefix and environment for each interpreter."""
    out = {}
    if "trainguard" in impls:
        env = dict(os.environ)
        src = str(REPO / "src")
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        out["trainguard"] = (sys.executable, env)
    if "smdebug" in impls:
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        out["smdebug"] = (str(ensure_smdebug_venv()), env)
    return out


def trainguard_importable(python, env):
    p = subprocess.run(
        [python, "-c", "import trainguard.pytorch as tg; tg.Hook, tg.SaveConfig, tg.ReductionConfig"],
        env=env,
        capture_output=True,
        text=True,
    )
    return p.returncode == 0, (p.stderr.strip().splitlines() or [""])[-1]


def run_worker(interp, impl, model, config, steps, warmup, tmp_root):
    python, env = interp
    with tempfile.TemporaryDirectory(prefix="tg-overhead-", dir=tmp_root) as d:
        cmd = [
            python,
            str(WORKER),
            "--impl",
            impl,
            "--model",
            model,
            "--config",
            config,
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
            "--out",
            os.path.join(d, "run"),
        ]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            raise RuntimeError(f"no result line from {' '.join(cmd)}:\n{p.stdout[-2000:]}")
        return json.loads(lines[-1])


def fmt_bytes(n):
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def fmt_ratio(x):
    return "—" if x is None else f"{x:.2f}x"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round, few steps")
    ap.add_argument("--rounds", type=int, help="default 3 (1 with --quick)")
    ap.add_argument("--models", default="cnn,mlp")
    ap.add_argument("--configs", default=",".join(HOOK_CONFIGS))
    ap.add_argument("--impls", default="trainguard,smdebug")
    ap.add_argument("--steps", default="", help="overrides, e.g. all_every_1=10,none=500")
    ap.add_argument("--steps-scale", type=float, default=1.0, help="multiply all step counts")
    ap.add_argument("--warmup", type=int, help="untimed steps per run (default 10; 5 with --quick)")
    ap.add_argument("--tmpdir", help="where runs write (default: system temp dir)")
    ap.add_argument("--markdown", action="store_true", help="also print a markdown table")
    ap.add_argument("--json", help="write all raw measurements to this file")
    args = ap.parse_args()

    rounds = args.rounds or (1 if args.quick else 3)
    warmup = args.warmup if args.warmup is not None else (5 if args.quick else 10)
    steps = dict(QUICK_STEPS if args.quick else STEPS)
    for item in filter(None, args.steps.split(",")):
        k, v = item.split("=")
        steps[k.strip()] = int(v)
    steps = {k: max(1, round(v * args.steps_scale)) for k, v in steps.items()}
    models = args.models.split(",")
    configs = args.configs.split(",")
    impls = [i for i in args.impls.split(",") if i]

    interps = interpreters(impls)
    if "trainguard" in interps:
        ok, why = trainguard_importable(*interps["trainguard"])
        if not ok:
            print(f"WARNING: trainguard.pytorch is not importable ({why}); measuring smdebug only", file=sys.stderr)
            impls.remove("trainguard")
            del interps["trainguard"]
    if not impls:
        sys.exit("nothing to measure")

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    started = time.monotonic()
    results = []  # every worker result, tagged with its round
    baselines = {}  # (round, model, interp) -> {"median_s", "mean_s", "drift"}
    for r in range(rounds):
        for model in models:

            def baseline(interp, model=model, r=r):
                res = run_worker(interps[interp], "none", model, "none", steps["none"], warmup, args.tmpdir)
                results.append(dict(res, round=r, interp=interp))
                return res

            first = {i: baseline(i) for i in interps}
            order = configs if r % 2 == 0 else configs[::-1]
            for k, config in enumerate(order):
                for impl in impls if (r + k) % 2 == 0 else impls[::-1]:
                    res = run_worker(interps[INTERP_OF[impl]], impl, model, config, steps[config], warmup, args.tmpdir)
                    results.append(dict(res, round=r, interp=INTERP_OF[impl]))
                    log(
                        f"[round {r + 1}/{rounds}] {model:3} {config:18} {impl:10} "
                        f"median {res['median_s'] * 1e3:8.2f} ms  mean {res['mean_s'] * 1e3:8.2f} ms  "
                        f"{fmt_bytes(res['bytes'])}"
                    )
            last = {i: baseline(i) for i in reversed(list(interps))}
            for i in interps:
                a, b = first[i], last[i]
                baselines[(r, model, i)] = {
                    "median_s": (a["median_s"] + b["median_s"]) / 2,
                    "mean_s": (a["mean_s"] + b["mean_s"]) / 2,
                    "drift": abs(a["median_s"] - b["median_s"]) / min(a["median_s"], b["median_s"]),
                }
                log(
                    f"[round {r + 1}/{rounds}] {model:3} {'none':18} {i:10} "
                    f"median {a['median_s'] * 1e3:8.2f} / {b['median_s'] * 1e3:.2f} ms (start/end)"
                )

    # Summaries: per (model, config, impl), the median over rounds of the per-round ratios.
    summary = []
    for model in models:
        for config in configs:
            row = {"model": model, "config": config, "steps": steps[config]}
            for impl in impls:
                runs = [x for x in results if (x["model"], x["config"], x["impl"]) == (model, config, impl)]
                if not runs:
                    continue
                med = [x["median_s"] / baselines[(x["round"], model, x["interp"])]["median_s"] for x in runs]
                mean = [x["mean_s"] / baselines[(x["round"], model, x["interp"])]["mean_s"] for x in runs]
                row[impl] = {
                    "slowdown_median": statistics.median(med),
                    "slowdown_mean": statistics.median(mean),
                    "bytes": int(statistics.median(x["bytes"] for x in runs)),
                    "files": int(statistics.median(x["files"] for x in runs)),
                    "median_ms": statistics.median(x["median_s"] for x in runs) * 1e3,
                }
            tg, smd = row.get("trainguard"), row.get("smdebug")
            row["tg_fraction"] = (
                (tg["slowdown_median"] - 1) / (smd["slowdown_median"] - 1)
                if tg and smd and smd["slowdown_median"] - 1 >= 0.02
                else None
            )
            summary.append(row)

    # Context lines.
    params = {x["model"]: x["params"] for x in results}
    info = [
        f"rounds={rounds} warmup={warmup} threads=1 batch=64 "
        f"cpu={platform.processor() or platform.machine()} cores={os.cpu_count()} "
        f"elapsed={time.monotonic() - started:.0f}s",
        "models: " + ", ".join(f"{m} ({params.get(m, 0):,} params)" for m in models),
    ]
    for model in models:
        for i in interps:
            b = [baselines[(r, model, i)] for r in range(rounds)]
            info.append(
                f"no-hook {model} [{i} python]: median step "
                f"{statistics.median(x['median_s'] for x in b) * 1e3:.2f} ms, "
                f"max start/end drift within a round {max(x['drift'] for x in b) * 100:.0f}%"
            )

    header = ["model", "config", "steps"]
    for impl in impls:
        header += [f"{impl} slowdown (median)", f"{impl} slowdown (mean)", f"{impl} bytes"]
    if len(impls) == 2:
        header.append("tg/smd overhead")

    def cells(row):
        c = [row["model"], row["config"], str(row["steps"])]
        for impl in impls:
            d = row.get(impl)
            c += (
                [fmt_ratio(d["slowdown_median"]), fmt_ratio(d["slowdown_mean"]), fmt_bytes(d["bytes"])]
                if d
                else ["—"] * 3
            )
        if len(impls) == 2:
            c.append("n/a" if row["tg_fraction"] is None else f"{row['tg_fraction']:.2f}")
        return c

    table = [header] + [cells(r) for r in summary]
    widths = [max(len(t[k]) for t in table) for k in range(len(header))]
    print()
    for line in info:
        print(line)
    print()
    for k, t in enumerate(table):
        print("  ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)))
        if k == 0:
            print("  ".join("-" * w for w in widths))
    if args.markdown:
        print()
        for line in info:
            print(f"- {line}")
        print()
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" for _ in header) + "|")
        for t in table[1:]:
            print("| " + " | ".join(t) + " |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "info": info,
                    "summary": summary,
                    "results": results,
                    "baselines": {f"{k[0]}/{k[1]}/{k[2]}": v for k, v in baselines.items()},
                },
                fh,
                indent=1,
            )


if __name__ == "__main__":
    main()
