"""What a hook on a parameter's AccumulateGrad node costs after it was removed, in one process.

A usual loop keeps the last step's loss (``loss = criterion(model(x), y)``) until the next
forward has run, so the graph that holds each parameter's AccumulateGrad node is alive when the
next forward looks the node up: every step shares one node per parameter for the whole run. A
Python hook put on that node and removed again leaves PyTorch's wrapper for Python hooks on it,
which takes the GIL and wraps the gradient at every later backward although it calls nothing.
This is why trainguard does not hook those nodes in a run an optimizer drives: it compares
``.grad`` with its state when the saved step began (hooks/torch_optimizer.py).

Blocks of steps of the bench MLP (bench/stacks/mlp.py's model, batch 64, Adam, one torch thread)
alternate between fresh nodes (the loss dropped before the block's first forward, so the next
forward makes new ones) and nodes that had a hook at the block's first step, removed after it
(the loss kept, as the loop keeps it). Drift hits both alike; the paired ratio per round is the
cost of the leftover wrappers.

    python bench/node_hook_ab.py --rounds 30 --block 1000
"""

from __future__ import annotations

import statistics
import sys
import time

from _ab_blocks import ab_arguments, bench_mlp


def main(argv: list[str] | None = None) -> int:
    args = ab_arguments(__doc__.splitlines()[0], rounds=30, block=1000).parse_args(argv)

    import torch

    from trainguard.hooks.torch_optimizer import AccumulationHook

    model, optimizer, criterion, inputs, labels = bench_mlp()
    kept: list[torch.Tensor] = []  # the last step's loss, as the loop's variable holds it

    def block(hooked: bool) -> float:
        hooks = (
            [AccumulationHook(parameter, lambda parameter: None) for parameter in model.parameters()] if hooked else []
        )
        if not hooked:
            kept.clear()  # no graph holds the nodes: this block's first forward makes fresh ones
        started = time.perf_counter()
        for step in range(args.block):
            optimizer.zero_grad()
            loss = criterion(model(inputs), labels)
            kept[:] = [loss]
            loss.backward()
            optimizer.step()
            if step == 0:
                for hook in hooks:
                    hook.remove()
        return (time.perf_counter() - started) / args.block * 1e6

    block(False)  # warm up
    fresh, leftover = [], []
    for round_index in range(args.rounds):
        for hooked in (False, True) if round_index % 2 else (True, False):
            (leftover if hooked else fresh).append(block(hooked))
    ratios = [after / before for before, after in zip(fresh, leftover, strict=True)]
    print(f"{args.rounds} rounds of {args.block} steps per variant, alternating; us per step (median)")
    print(f"fresh nodes {statistics.median(fresh):.1f}  nodes that had a hook {statistics.median(leftover):.1f}")
    print(f"paired ratio per round: median {statistics.median(ratios):.4f}x, mean {statistics.mean(ratios):.4f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
