"""What the zero-code hook costs on steps it saves nothing in, measured inside one process.

Whole-process A/B runs cannot resolve a few percent on a shared machine (its speed drifts by
+-25 % within minutes). Here one process trains the bench MLP (bench/stacks/mlp.py's model,
batch 64, Adam, one torch thread) in short blocks of steps, alternating blocks without a hook
and blocks under a fresh ZeroCodeHook whose schedule saves nothing after its first step (the
hook is created before and closed after its block, outside the timing). Drift then hits both
variants alike; low quantiles of the per-block step times are what a step costs when the core
is the run's own.

    python bench/unsaved_hook_ab.py --rounds 300 --block 20
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--block", type=int, default=20, help="training steps per timed block")
    args = parser.parse_args(argv)

    import torch
    from torch import nn

    from trainguard.config.save_config import SaveConfig
    from trainguard.hooks.zero_code import ZeroCodeHook

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    inputs, labels = torch.randn(64, 64), torch.randint(0, 10, (64,))

    def step() -> None:
        optimizer.zero_grad()
        criterion(model(inputs), labels).backward()
        optimizer.step()

    for _ in range(50):
        step()
    out = tempfile.mkdtemp(prefix="tg-hook-ab-")
    microseconds: dict[str, list[float]] = {"plain": [], "hook": []}
    for round_index in range(args.rounds):
        for variant in ("plain", "hook") if round_index % 2 else ("hook", "plain"):
            hook = None
            if variant == "hook":
                hook = ZeroCodeHook(out_dir=os.path.join(out, str(round_index)), include_collections=["losses"],
                                    save_config=SaveConfig(save_interval=10**7), writer="thread")  # fmt: skip
                for _ in range(3):  # step 0 (saved) and the first unsaved ones leave the general path
                    step()
            started = time.perf_counter()
            for _ in range(args.block):
                step()
            microseconds[variant].append((time.perf_counter() - started) / args.block * 1e6)
            if hook is not None:
                hook.close()
    print(f"{args.rounds} rounds of {args.block} steps per variant, alternating; us per step")
    for quantile in (0.05, 0.1, 0.25, 0.5):
        plain, hooked = (sorted(values)[int(quantile * args.rounds)] for values in microseconds.values())
        print(f"q{quantile:<4}: plain {plain:7.1f}  hook {hooked:7.1f}  added {hooked - plain:5.1f} "
              f"({hooked / plain:.4f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
