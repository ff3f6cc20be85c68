"""What saving whole validation passes costs: an evaluation pass of the bench MLP (64-sample
batches, ~0.3 ms forward) with the losses of its first N steps saved (TRAINGUARD_EVAL_PASS_STEPS,
default 64) against the schedule alone (N = 0: every 10th EVAL step).

    python -m bench.eval_pass_cost [--batches 256] [--passes 6] [--limit 64]

Prints the seconds per pass of each, in turns (A/B/A/B...: the machine's load moves), their
medians and the cost per saved losses-only step. Each pass runs in a fresh hook's process state
of its own out_dir; the first pass of each kind is a warm-up (writer start) and not counted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from torch import nn

import trainguard.pytorch as tg
from trainguard.hooks.eval_passes import EvalPassSaves


def _run(limit: int, batches: int, passes: int) -> list[float]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs, labels = torch.randn(batches * 64, 64), torch.randint(0, 10, (batches * 64,))
    with tempfile.TemporaryDirectory() as out:
        hook = tg.Hook(out, save_config=tg.SaveConfig(save_interval=10))
        hook.eval_pass_saves = EvalPassSaves(limit)
        hook.register_module(model)
        hook.register_loss(criterion)
        seconds = []
        for _ in range(passes + 1):
            model.train()  # one training step between passes: a new pass each time
            optimizer.zero_grad()
            criterion(model(inputs[:64]), labels[:64]).backward()
            optimizer.step()
            model.eval()
            started = time.perf_counter()
            with torch.no_grad():
                for batch in range(batches):
                    criterion(model(inputs[batch * 64 : (batch + 1) * 64]), labels[batch * 64 : (batch + 1) * 64])
            seconds.append(time.perf_counter() - started)
        hook.close()
    return seconds[1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=256)
    parser.add_argument("--passes", type=int, default=6)
    parser.add_argument("--limit", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    whole: list[float] = []
    schedule: list[float] = []
    for _ in range(args.turns):
        whole += _run(args.limit, args.batches, args.passes)
        schedule += _run(0, args.batches, args.passes)
    a, b = statistics.median(whole), statistics.median(schedule)
    extra = round(0.9 * min(args.limit, args.batches))  # the schedule saves every 10th of them anyway
    print(f"pass of {args.batches} batches: first {args.limit} saved {a * 1e3:.1f} ms, schedule alone {b * 1e3:.1f} ms "
          f"(medians of {len(whole)}); {(a - b) / max(extra, 1) * 1e3:.3f} ms per extra saved step "
          f"({extra} extra), {100 * (a - b) / b:.1f} % of the pass")


if __name__ == "__main__":
    main()
