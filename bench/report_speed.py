"""How long ``trainguard report`` takes on a 1,000-step run, next to reading every value one by one.

    python bench/report_speed.py [--steps 1000] [--keep DIR]

Trains a small MLP for ``--steps`` TRAIN steps (plus EVAL steps every 100) with the hook saving
weights, biases, gradients, losses and ReLU outputs at every step, then times, in one process:

* report: ``build_page`` (the dashboard's reader: every saved step read once, one batched read
  per step, curves downsampled to min/max buckets, weight histograms at 3 steps);
* naive: ``trial.tensor(name).value(step)`` for every tensor at every saved step (what a
  notebook plotting the same curves without batching or subsampling does).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn

import trainguard.pytorch as tg
from trainguard.report import build_page
from trainguard.trial import create_trial


def train(out_dir: Path, steps: int) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hook = tg.Hook(
        str(out_dir),
        save_config=tg.SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "gradients", "losses", "relu_output"],
    )
    hook.register_module(model)
    hook.register_loss(loss_fn)
    x, y = torch.randn(32, 32), torch.randint(0, 10, (32,))
    for step in range(steps):
        hook.set_mode(tg.modes.TRAIN)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        if step % 100 == 99:
            hook.set_mode(tg.modes.EVAL)
            with torch.no_grad():
                loss_fn(model(x), y)
    hook.close()


def naive_read(path: Path) -> int:
    trial = create_trial(path)
    count = 0
    for name in trial.tensor_names():
        tensor = trial.tensor(name)
        for step in tensor.steps():
            tensor.value(step)
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--keep", help="write the run and report here instead of a temporary folder")
    args = parser.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tg-report-bench-"))
    run = folder / "run"
    try:
        started = time.perf_counter()
        train(run, args.steps)
        print(f"trained {args.steps} steps in {time.perf_counter() - started:.1f} s -> {run}")
        size = sum(path.stat().st_size for path in run.rglob("*") if path.is_file())
        print(f"run: {len(create_trial(run).steps())} saved steps, {size / 2**20:.1f} MiB")

        started = time.perf_counter()
        page = build_page(str(run))
        report_s = time.perf_counter() - started
        (folder / "report.html").write_text(page.html)
        print(f"report: {report_s:.2f} s (read {page.read_seconds:.2f} s), {len(page.html) / 1024:.0f} KiB of HTML")

        started = time.perf_counter()
        values = naive_read(run)
        naive_s = time.perf_counter() - started
        print(f"naive: {naive_s:.2f} s reading {values} values one by one")
        print(f"ratio naive/report: {naive_s / report_s:.1f}x")
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
