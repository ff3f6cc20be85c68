"""What the zero-code hook costs on steps it saves nothing in, measured inside one process.

Whole-process A/B runs resolve about half a percent here, and only with many repetitions
(bench/real_stacks.py). Here one process trains the bench MLP (bench/stacks/mlp.py's model, batch
64, Adam, one torch thread) under one ZeroCodeHook created before the model, as ``trainguard run``
creates it, whose schedule saves step 0 and nothing after. Blocks of steps alternate between the
hook's per-step path in place (the model's call shim and, in a run of unsaved steps, the C
callable the optimizer's ``_optimizer_step_code`` is set to, or the global optimizer post-hook at
the step that begins such a run: all an unsaved step runs of trainguard) and taken out, each
block leaving them as it found them (the hook then sees nothing; it resumes counting when they
are back). Drift hits both alike; low quantiles of the per-block step times are what a step costs
when the core is the run's own.

One hook serves every block: a fresh hook per block would time the transient after a hook is
created (class attributes it sets and ``Optimizer.__init__``'s wrapper make Python re-specialise
the optimizer's code for a few hundred steps), not the unsaved step.

    python bench/unsaved_hook_ab.py --rounds 300 --block 50
"""

from __future__ import annotations

import sys
import tempfile
import time

from _ab_blocks import ab_arguments, bench_mlp


def main(argv: list[str] | None = None) -> int:
    args = ab_arguments(__doc__.splitlines()[0], rounds=300, block=50).parse_args(argv)

    import torch.optim.optimizer as optimizer_module

    from trainguard.config.save_config import SaveConfig
    from trainguard.hooks.torch_root_call import _SLOT
    from trainguard.hooks.zero_code import ZeroCodeHook

    hook = ZeroCodeHook(out_dir=tempfile.mkdtemp(prefix="tg-hook-ab-"), include_collections=["losses"],
                        save_config=SaveConfig(save_interval=10**7))  # fmt: skip
    model, optimizer, criterion, inputs, labels = bench_mlp()

    def step() -> None:
        optimizer.zero_grad()
        criterion(model(inputs), labels).backward()
        optimizer.step()

    for _ in range(300):  # step 0 saved, the rest through the usual unsaved path; code specialised
        step()
    post_hooks = optimizer_module._global_optimizer_post_hooks
    if model.__dict__.get(_SLOT) is None or len(post_hooks) + ("_optimizer_step_code" in vars(optimizer)) != 1:
        raise SystemExit("the hook does not drive the model through its call shim and one step-end signal")
    taken: list[tuple[object, object, dict[int, object]]] = []

    def attach(present: bool) -> None:
        if present and taken:
            shim, step_code, hooks = taken.pop()
            model.__dict__[_SLOT] = shim
            if step_code is not None:
                optimizer.__dict__["_optimizer_step_code"] = step_code
            post_hooks.update(hooks)
        elif not present and not taken:
            taken.append((model.__dict__.pop(_SLOT), optimizer.__dict__.pop("_optimizer_step_code", None),
                          dict(post_hooks)))  # fmt: skip
            post_hooks.clear()

    counted = hook.step
    microseconds: dict[str, list[float]] = {"plain": [], "hook": []}
    for round_index in range(args.rounds):
        for variant in ("plain", "hook") if round_index % 2 else ("hook", "plain"):
            attach(variant == "hook")
            started = time.perf_counter()
            for _ in range(args.block):
                step()
            microseconds[variant].append((time.perf_counter() - started) / args.block * 1e6)
    attach(True)
    hook.close()
    if hook.step - counted != args.rounds * args.block:
        raise SystemExit(f"the hook counted {hook.step - counted} steps of its blocks, not {args.rounds * args.block}")
    print(f"{args.rounds} rounds of {args.block} steps per variant, alternating; us per step")
    for quantile in (0.05, 0.1, 0.25, 0.5):
        plain, hooked = (sorted(values)[int(quantile * args.rounds)] for values in microseconds.values())
        print(f"q{quantile:<4}: plain {plain:7.1f}  hook {hooked:7.1f}  added {hooked - plain:5.1f} "
              f"({hooked / plain:.4f}x)")  # fmt: skip
    ratios = sorted(h / p for h, p in zip(microseconds["hook"], microseconds["plain"], strict=True))
    print(f"paired ratio per round: median {ratios[len(ratios) // 2]:.4f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
