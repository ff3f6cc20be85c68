"""What one saved step costs the training process in all, the steps after it included, measured
inside one process.

Whole-process runs of ``--save-interval 1000`` against "step 0 saved, then nothing"
(bench/real_stacks.py) differ by about as much as identical processes do. Here one process trains
the bench MLP (bench/stacks/mlp.py's model, batch 64, Adam, one torch thread) under one
ZeroCodeHook with the default collections, created before the model as ``trainguard run`` creates
it. Its schedule (``save_steps``) saves the first step of some blocks of ``--block`` steps and
nothing in the others; each round runs one block of each kind, in random order. A block's time
minus its partner's is what a save costs with everything it leaves behind for the rest of the
block (hooks removed at the next step, the writer process woken, caches refilled).

    python bench/saved_step_ab.py --rounds 150 --block 1000
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time

from _ab_blocks import ab_arguments, bench_mlp

WARM_STEPS = 300  # step 0 saved, then the usual unsaved path until code is specialised


def main(argv: list[str] | None = None) -> int:
    parser = ab_arguments(__doc__.splitlines()[0], rounds=150, block=1000)
    parser.add_argument("--seed", type=int, default=1, help="the blocks' order")
    args = parser.parse_args(argv)

    from trainguard.config.save_config import SaveConfig
    from trainguard.hooks.zero_code import ZeroCodeHook
    from trainguard.trials import create_trial

    rng = random.Random(args.seed)
    orders = [rng.sample(["saved", "unsaved"], 2) for _ in range(args.rounds)]
    save_steps, position = [0], WARM_STEPS
    for order in orders:
        for kind in order:
            if kind == "saved":
                save_steps.append(position)
            position += args.block
    hook = ZeroCodeHook(out_dir=tempfile.mkdtemp(prefix="tg-saved-ab-"), save_config=SaveConfig(save_steps=save_steps))
    model, optimizer, criterion, inputs, labels = bench_mlp(samples=4096)
    done = 0

    def train(steps: int) -> None:
        nonlocal done
        for _ in range(steps):
            start = (done * 64) % 4032
            done += 1
            optimizer.zero_grad()
            criterion(model(inputs[start : start + 64]), labels[start : start + 64]).backward()
            optimizer.step()

    train(WARM_STEPS)
    seconds: dict[str, list[float]] = {"saved": [], "unsaved": []}
    for order in orders:
        for kind in order:
            started = time.perf_counter()
            train(args.block)
            seconds[kind].append(time.perf_counter() - started)
    hook.close()
    written = len(create_trial(hook.out_dir).steps())
    if written != len(save_steps):
        raise SystemExit(f"the hook wrote {written} steps, not the {len(save_steps)} scheduled")
    differences = [(s - u) * 1e3 for s, u in zip(seconds["saved"], seconds["unsaved"], strict=True)]
    mean = statistics.fmean(differences)
    half_width = 1.96 * statistics.stdev(differences) / len(differences) ** 0.5
    unsaved_ms = statistics.median(seconds["unsaved"]) * 1e3
    print(f"{args.rounds} rounds of a {args.block}-step block with a save at its first step and one without")
    print(f"block without a save: median {unsaved_ms:.1f} ms")
    print(f"a save's cost (block with minus block without): median {statistics.median(differences):.2f} ms, "
          f"mean {mean:.2f} ms +- {half_width:.2f} (95 %); {mean / unsaved_ms * 100:.2f} % of a block")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
