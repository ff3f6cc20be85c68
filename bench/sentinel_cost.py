"""What the per-step sentinel (src/trainguard/hooks/sentinel.py) costs a training step, measured
side by side in one process: the mlp stack of bench/real_stacks.py (bench/stacks/mlp.py's model,
optimizer and batches) under the zero-code hook at its default schedule, in alternating blocks
of steps with the sentinel watching and not (its watched parameters taken away: the optimizer's
end signal is then the plain C callables again, and nothing is read at the runs' ends). Blocks
alternate ABBA so that drift hits both alike; the figure is the median of the per-pair ratios of
block times (on / off, the training thread's CPU time), and its spread. On a loaded machine that
ratio cannot resolve a few tenths of a percent, so the sentinel's two parts are also timed alone
(the best of repeated timings, which load only lengthens): the optimizer's end-of-step callable
with and without the appending, and the read at a run's end (one stack of ``save_interval``
gradients, isfinite, one read-back), divided by the run's steps; their sum over the step's time
is the second figure.

    python bench/sentinel_cost.py                      # 40 pairs of 500-step blocks, CPU
    python bench/sentinel_cost.py --pairs 10 --block 200 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.real_stacks import STACKS  # noqa: E402  (the stack this measures)
from trainguard.hooks.zero_code import ZeroCodeHook  # noqa: E402

STACK = "mlp"


def build(device: str) -> tuple[nn.Module, torch.optim.Optimizer, nn.Module, torch.Tensor, torch.Tensor]:
    """bench/stacks/mlp.py's model, optimizer, loss and data (the same sizes and seed)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs = torch.randn(4096, 64, device=device)
    labels = torch.randint(0, 10, (4096,), device=device)
    return model, optimizer, nn.CrossEntropyLoss(), inputs, labels


def block(model, optimizer, criterion, inputs, labels, first: int, steps: int, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.thread_time()  # this thread's CPU time: waiting for a core under load is not counted
    for start in [(step * 64) % 4032 for step in range(first, first + steps)]:  # the stack's batches
        optimizer.zero_grad()
        criterion(model(inputs[start : start + 64]), labels[start : start + 64]).backward()
        optimizer.step()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.thread_time() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=40, help="at least 2")
    parser.add_argument("--block", type=int, default=500, help="steps per block")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args(argv)
    if args.pairs < 2:
        parser.error("--pairs must be 2 or more (the figure is a median of their ratios and quartiles)")
    assert STACK in STACKS
    torch.set_num_threads(1)
    model, optimizer, criterion, inputs, labels = build(args.device)
    with tempfile.TemporaryDirectory() as out:
        hook = ZeroCodeHook(out_dir=out)
        sentinel = hook._sentinel
        step = 40
        block(model, optimizer, criterion, inputs, labels, 0, 40, args.device)  # warm, optimizer noted
        watched = dict(sentinel.watched)
        assert watched, "the sentinel watches no optimizer: nothing to measure"
        times: dict[bool, list[float]] = {True: [], False: []}
        for pair in range(args.pairs):
            for on in ((True, False) if pair % 2 == 0 else (False, True)):
                sentinel.watched.clear()
                if on:
                    sentinel.watched.update(watched)
                times[on].append(block(model, optimizer, criterion, inputs, labels, step, args.block, args.device))
                step += args.block
        hook.close()
        micro = parts(sentinel, watched, optimizer, args.device)
    ratios = [on / off for on, off in zip(times[True], times[False], strict=True)]
    step_us = 1e6 * statistics.median(times[False]) / args.block
    median = statistics.median(ratios)
    quartiles = statistics.quantiles(ratios, n=4)
    print(f"{STACK} stack, {args.device}, zero-code hook at its default schedule, {args.pairs} pairs of "
          f"{args.block}-step blocks")  # fmt: skip
    print(f"step without the sentinel: {step_us:.1f} us (median block)")
    print(f"sentinel on / off: median {median:.4f} ({100 * (median - 1):+.2f} %), quartiles "
          f"{quartiles[0]:.4f} .. {quartiles[2]:.4f}")  # fmt: skip
    per_step_ns = micro["append_ns"] + micro["read_ns"] / micro["interval"]
    print(f"parts alone: appending {micro['append_ns']:.0f} ns a step; the read at a run's end "
          f"{micro['read_ns'] / 1000:.1f} us per {micro['interval']} steps; together "
          f"{per_step_ns:.0f} ns a step = {100 * per_step_ns / (1000 * step_us):.3f} % of the step")  # fmt: skip
    return 0


def _best_ns(function, calls: int, repeats: int = 7) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.thread_time_ns()
        for _ in range(calls):
            function()
        best = min(best, (time.thread_time_ns() - started) / calls)
    return best


def parts(sentinel, watched, optimizer, device: str) -> dict[str, float]:
    """The end-of-step callable with and without the appending (as torch_optimizer.py builds it),
    and the read of one run's gradients (sentinel._check on save_interval entries)."""
    import functools
    import itertools
    import operator

    from trainguard.hooks.quiet_run import QuietRun

    quiet = QuietRun()
    parameter, name = next(iter(watched.values()))
    calls = 200_000
    plain = functools.partial(next, map(functools.partial(setattr, quiet, "pending"), itertools.repeat(True)))
    entries: list = []
    entry = zip(map(operator.attrgetter("grad"), itertools.repeat(parameter)),
                map(operator.attrgetter("left"), itertools.repeat(quiet)),
                map(operator.attrgetter("removed"), itertools.repeat(quiet)), itertools.repeat(name))  # fmt: skip
    flags = map(operator.is_, map(entries.append, entry), itertools.repeat(None))
    recording = functools.partial(next, map(functools.partial(setattr, quiet, "pending"), flags))

    def record_and_drop() -> None:
        recording()
        if len(entries) > 1000:
            entries.clear()

    def plain_and_check() -> None:  # the same Python around it, so that only the C work differs
        plain()
        if len(entries) > 1000:
            entries.clear()

    append_ns = _best_ns(record_and_drop, calls) - _best_ns(plain_and_check, calls)
    interval = 10  # the default save interval: a run of unsaved steps is read once per interval
    gradients = [torch.randn_like(parameter) for _ in range(interval)]
    sentinel._base = (0, 0, interval)
    batch = [(gradient, interval - index, 0, name) for index, gradient in enumerate(gradients)]
    read_ns = _best_ns(lambda: sentinel._check(batch, None), 2000)
    return {"append_ns": max(append_ns, 0.0), "read_ns": read_ns, "interval": interval}


if __name__ == "__main__":
    raise SystemExit(main())
