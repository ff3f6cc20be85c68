"""One benchmark measurement: train a small model with or without a debugger hook, time each step.

Run by bench/overhead.py, once per (implementation, model, configuration), in a fresh process so
that hooks, caches and allocator state never leak from one measurement into the next. Runs under
either interpreter: trainguard's (with src/ on PYTHONPATH) or the smdebug 1.0.34 venv. Both hooks
have the same API, so the only difference between --impl trainguard and --impl smdebug is the
module the hook comes from.

    python bench/_overhead_worker.py --impl none|trainguard|smdebug --model cnn|mlp \
        --config NAME --steps N --warmup W --out DIR

Prints one JSON line on stdout (last line): per-step time statistics over the N timed steps,
bytes written under DIR, and context.
"""

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time

# smdebug logs to stdout (its logger holds on to sys.stdout when created). Send everything but
# our final JSON line to stderr, and quiet smdebug's INFO chatter.
RESULT_OUT = sys.stdout
sys.stdout = sys.stderr
os.environ.setdefault("SMDEBUG_LOG_LEVEL", "error")
os.environ.pop("TRAINING_JOB_NAME", None)  # set = "SageMaker job", changes hook behaviour

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

BATCH = 64
N_BATCHES = 16  # synthetic data pre-generated once and cycled: no data loading in the timing

# Hook configurations. "none" = no hook at all. Collections as named in smdebug's API.
WBGL = ["weights", "biases", "gradients", "losses"]
CONFIGS = {
    "none": None,
    "all_every_1": dict(save_all=True, interval=1),
    "all_every_10": dict(save_all=True, interval=10),
    "all_every_100": dict(save_all=True, interval=100),
    "all_every_500": dict(save_all=True, interval=500),
    "wbgl_every_10": dict(include_collections=WBGL, interval=10),
    "reductions_every_1": dict(include_collections=WBGL, interval=1, reductions=True),
}


def make_model(name):
    if name == "cnn":
        # The reference CNN: 160 + 4,640 + 102,528 + 1,290 = 108,618 parameters.
        return nn.Sequential(
            nn.Conv2d(1, 16, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 28 -> 26 -> 13
            nn.Conv2d(16, 32, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 13 -> 11 -> 5
            nn.Flatten(),
            nn.Linear(32 * 5 * 5, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
        )
    if name == "mlp":  # 784-256-128-10: 235,146 parameters
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(784, 256),
            nn.ReLU(),
            nn.Linear(256, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
        )
    raise SystemExit(f"unknown model {name}")


def make_hook(impl, config, out_dir):
    """Build the hook through the public API shared by smdebug.pytorch and trainguard.pytorch."""
    if impl == "smdebug":
        import smdebug.pytorch as lib
    else:
        import trainguard.pytorch as lib
    kwargs = dict(
        out_dir=out_dir,
        save_config=lib.SaveConfig(save_interval=config["interval"]),
        save_all=config.get("save_all", False),
    )
    if "include_collections" in config:
        kwargs["include_collections"] = list(config["include_collections"])
    if config.get("reductions"):
        kwargs["reduction_config"] = lib.ReductionConfig(
            reductions=["min", "max", "mean", "std"], norms=["l2"], save_raw_tensor=False
        )
    hook = lib.Hook(**kwargs)
    modes = getattr(lib, "modes", None)
    if modes is not None and hasattr(hook, "set_mode"):
        hook.set_mode(modes.TRAIN)  # smdebug starts in GLOBAL mode; this is a training loop
    return hook


def dir_bytes(path):
    total = files = 0
    for root, _, names in os.walk(path):
        for n in names:
            total += os.path.getsize(os.path.join(root, n))
            files += 1
    return total, files


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=["none", "trainguard", "smdebug"], required=True)
    ap.add_argument("--model", choices=["cnn", "mlp"], required=True)
    ap.add_argument("--config", choices=sorted(CONFIGS), required=True)
    ap.add_argument("--steps", type=int, required=True, help="timed steps")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    ap.add_argument("--out", required=True, help="hook out_dir; must not exist yet")
    args = ap.parse_args()
    config = CONFIGS[args.config]
    if (args.impl == "none") != (config is None):
        raise SystemExit("--impl none goes with --config none, and only with it")

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(0)
    data = [(torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))) for _ in range(N_BATCHES)]
    model = make_model(args.model)
    n_params = sum(p.numel() for p in model.parameters())
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    hook = None
    t0 = time.perf_counter()
    if config is not None:
        hook = make_hook(args.impl, config, args.out)
        hook.register_module(model)
        hook.register_loss(criterion)
    setup_s = time.perf_counter() - t0

    times = []
    gc.collect()
    for i in range(args.warmup + args.steps):
        x, y = data[i % N_BATCHES]
        t = time.perf_counter()
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        dt = time.perf_counter() - t
        if i >= args.warmup:
            times.append(dt)

    close_s = 0.0
    if hook is not None:
        t = time.perf_counter()
        hook.close()  # writes the last step and the end marker; not part of the step times
        close_s = time.perf_counter() - t
    nbytes, nfiles = dir_bytes(args.out) if os.path.isdir(args.out) else (0, 0)

    result = {
        "impl": args.impl,
        "model": args.model,
        "config": args.config,
        "steps": args.steps,
        "warmup": args.warmup,
        "median_s": statistics.median(times),
        "mean_s": statistics.fmean(times),
        "min_s": min(times),
        "max_s": max(times),
        "total_s": sum(times),
        "setup_s": setup_s,
        "close_s": close_s,
        "bytes": nbytes,
        "files": nfiles,
        "params": n_params,
        "final_loss": float(loss.item()),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    print(json.dumps(result), file=RESULT_OUT, flush=True)


if __name__ == "__main__":
    main()
