"""Training-step overhead of the Keras hook: every tensor saved every 10 steps vs no hook.

    python bench/keras_overhead.py                      # torch backend, 8 rounds of 50 steps
    python bench/keras_overhead.py --rounds 4 --steps 30
    KERAS_BACKEND=jax python bench/keras_overhead.py    # the JAX backend instead

A small CNN (two conv layers, two dense) on synthetic 28x28 images, batch 64, SGD. One process:
after a warm-up fit of each kind, rounds alternate a ``fit`` without callbacks and a ``fit``
with one ``KerasHook(save_all=True, save_config=SaveConfig(save_interval=10))`` (weights,
biases, gradients, every layer's inputs and outputs, losses, metrics; the hook's writer is
flushed at the end of each hooked fit and that wait counts), the order swapped every round so
that slow phases of a shared machine hit both alike. A timing callback (first in the list)
stamps every batch begin: a step's time includes every callback, the hook's included.

Reported: slowdown = the median over rounds of (hooked mean step time / plain mean step time
of the same round): the mean includes the saving steps, amortized; pairing within a round
cancels most of a shared machine's drift. Also the pooled mean and median step times (the
median is the typical, non-saving step), and the same paired ratio of process CPU time per step
(all threads, the writer's included): on a machine shared with other jobs, wall time measures
the neighbours as much as the hook; CPU time measures the work the hook adds. torch runs with
one intra-op thread (``--threads``), as bench/overhead.py. Target: slowdown <= 1.10.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import trainguard.keras as tg  # noqa: E402

BATCH = 64


class StepTimer(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[float] = []

    def on_train_batch_begin(self, batch, logs=None):
        self.stamps.append(time.perf_counter())

    def on_train_end(self, logs=None):
        self.stamps.append(time.perf_counter())

    def step_times(self) -> list[float]:
        return [later - earlier for earlier, later in zip(self.stamps, self.stamps[1:], strict=False)]


def build_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu", name="conv1"),
            keras.layers.MaxPooling2D(2, name="pool1"),
            keras.layers.Conv2D(32, 3, activation="relu", name="conv2"),
            keras.layers.MaxPooling2D(2, name="pool2"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(64, activation="relu", name="fc1"),
            keras.layers.Dense(10, name="fc2"),
        ],
        name="cnn",
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def timed_fit(model: keras.Model, x: np.ndarray, y: np.ndarray, hook: tg.KerasHook | None) -> tuple[list[float], float]:
    """Step times, and the process CPU time (all threads, the writer's included) per step."""
    timer = StepTimer()
    callbacks = [timer] + ([hook] if hook is not None else [])
    cpu = time.process_time()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    if hook is not None:
        flushing = time.perf_counter()
        hook.flush()  # what is still queued is written now: part of the cost
        timer.stamps[-1] += time.perf_counter() - flushing
    steps = timer.step_times()
    return steps, (time.process_time() - cpu) / len(steps)


def directory_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def set_threads(threads: int) -> None:
    if keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=50, help="timed steps per fit (a multiple of the interval)")
    parser.add_argument("--save-interval", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (torch backend)")
    args = parser.parse_args()
    set_threads(args.threads)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.steps * BATCH, 28, 28, 1)).astype("float32")
    y = rng.integers(0, 10, size=args.steps * BATCH)
    model = build_model()
    work = tempfile.mkdtemp(prefix="trainguard-keras-bench-")
    # One hook for every hooked fit, as in a real job: its step numbers run on across fits
    # (each fit of --steps steps saves --steps/--save-interval times) and on JAX its capture
    # step is compiled once. Both configurations are warmed up (compilation) before timing.
    hook = tg.KerasHook(work, save_all=True, save_config=tg.SaveConfig(save_interval=args.save_interval))
    warm = slice(0, 2 * args.save_interval * BATCH)
    model.fit(x[warm], y[warm], batch_size=BATCH, epochs=1, verbose=0)
    model.fit(x[warm], y[warm], batch_size=BATCH, epochs=1, verbose=0, callbacks=[hook])
    hook.flush()
    warm_bytes = directory_bytes(work)

    times: dict[str, list[float]] = {"none": [], "hook": []}
    ratios: list[float] = []  # hooked / plain mean step time, paired within each round
    cpu_ratios: list[float] = []  # the same for CPU time per step
    try:
        for round_index in range(args.rounds):
            order = ("none", "hook") if round_index % 2 == 0 else ("hook", "none")
            means, cpu = {}, {}
            for config in order:
                steps, cpu[config] = timed_fit(model, x, y, hook if config == "hook" else None)
                times[config].extend(steps)
                means[config] = statistics.mean(steps)
            ratios.append(means["hook"] / means["none"])
            cpu_ratios.append(cpu["hook"] / cpu["none"])
            print(
                f"round {round_index}: no hook {means['none'] * 1e3:6.2f} ms/step (cpu {cpu['none'] * 1e3:6.2f}), "
                f"hook {means['hook'] * 1e3:6.2f} ms/step (cpu {cpu['hook'] * 1e3:6.2f}), "
                f"ratio {ratios[-1]:.3f} (cpu {cpu_ratios[-1]:.3f})",
                flush=True,
            )
        hook.close()
        saved_bytes = (directory_bytes(work) - warm_bytes) / args.rounds
    finally:
        shutil.rmtree(work, ignore_errors=True)

    none_mean, hook_mean = statistics.mean(times["none"]), statistics.mean(times["hook"])
    none_median, hook_median = statistics.median(times["none"]), statistics.median(times["hook"])
    print(f"backend {keras.backend.backend()}, keras {keras.__version__}, {args.rounds} rounds x {args.steps} steps")
    print(f"  no hook        : mean {none_mean * 1e3:7.2f} ms/step, median {none_median * 1e3:7.2f} ms/step")
    hook_label = f"hook (all / {args.save_interval})"
    print(f"  {hook_label:<15}: mean {hook_mean * 1e3:7.2f} ms/step, median {hook_median * 1e3:7.2f} ms/step")
    print(f"  slowdown       : {statistics.median(ratios):.3f}x (median over rounds of the paired mean ratio)")
    print(f"                   pooled: mean {hook_mean / none_mean:.3f}x, median step {hook_median / none_median:.3f}x")
    print(f"  cpu time       : {statistics.median(cpu_ratios):.3f}x (process CPU time per step, writer included)")
    print(f"  data per fit   : {saved_bytes / 2**20:.1f} MiB ({args.steps // args.save_interval} saved steps)")


if __name__ == "__main__":
    main()
