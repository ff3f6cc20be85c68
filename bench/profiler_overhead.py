"""Training-step overhead of trainguard's profiler on the reference CNN (CPU, one torch thread).

    python bench/profiler_overhead.py              # 30 rounds x 60 timed steps per configuration
    python bench/profiler_overhead.py --quick      # smoke run: 2 rounds x 50 steps
    python bench/profiler_overhead.py --rounds 60 --steps 40    # more, shorter rounds (noisier machines)

The table it prints is markdown; record its figures with bench/results_table.py.

The model is bench/overhead.py's reference CNN (108,618 parameters), batch 64 of synthetic
28x28 images pre-generated once (no data loading in the timing), SGD. Configurations:

  none           no profiler
  system_500ms   system sampler every 500 ms (framework profiler off)
  system_100ms   system sampler every 100 ms (framework profiler off)
  framework      PyTorch step timings only (hooks on forward/backward/optimizer/DataLoader)
  full_500ms     both: sampler every 500 ms and step timings (the zero-code default)

All configurations run in this one process, interleaved: each round runs every configuration
once (a fresh model and profiler each time, order reversed every other round), so a slow phase
of a shared machine hits all of them alike. slowdown = median step time of a configuration /
median step time of "none" in the same round; the table gives the median over rounds. On a
shared machine wall time swings with other processes' load, so the process CPU time per step
(all threads of this process, the sampler's included) is reported beside it. The
profiler's own files go to a temp dir. The cost of one system sample (read /proc + NVML + write
the lines) is also timed directly, and the framework hooks alone in a finer paired A/B.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from trainguard.profiler import Profiler  # noqa: E402
from trainguard.profiler.output import LocalOutput, SystemMetricsWriter  # noqa: E402
from trainguard.profiler.system import GpuSampler, HostSampler  # noqa: E402

BATCH = 64
N_BATCHES = 16
CONFIGS = {
    "none": None,
    "system_500ms": dict(interval_ms=500, framework=False),
    "system_100ms": dict(interval_ms=100, framework=False),
    "framework": dict(interval_ms=500, framework=True, system=False),
    "full_500ms": dict(interval_ms=500, framework=True),
}


def make_cnn() -> nn.Module:
    """bench/overhead.py's reference CNN: 160 + 4,640 + 102,528 + 1,290 = 108,618 parameters."""
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 5 * 5, 128), nn.ReLU(), nn.Linear(128, 10),
    )  # fmt: skip
    assert sum(p.numel() for p in model.parameters()) == 108_618
    return model


def measure(
    config: dict | None, steps: int, warmup: int, data: list, out_root: str
) -> tuple[list[float], float, float]:
    """Wall time of each timed step, process CPU seconds per timed step (all threads: the
    sampler's work is included; other processes' load on a shared machine is not), and the
    profiler thread's CPU time as a fraction of the run's wall time."""
    torch.manual_seed(0)
    model = make_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    profiler = None
    if config is not None:
        profiler = Profiler(tempfile.mkdtemp(dir=out_root), **config).start()
    times = []
    cpu_start = 0.0
    wall_start = time.perf_counter()
    try:
        for index in range(warmup + steps):
            x, y = data[index % len(data)]
            if index == warmup:
                cpu_start = time.process_time()
            start = time.perf_counter()
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if index >= warmup:
                times.append(time.perf_counter() - start)
        cpu_per_step = (time.process_time() - cpu_start) / steps
    finally:
        if profiler is not None:
            profiler.stop()
    thread_share = profiler.thread_cpu_s / (time.perf_counter() - wall_start) if profiler is not None else 0.0
    return times, cpu_per_step, thread_share


def hooks_ab(pairs: int, steps: int, data: list) -> list[float]:
    """Framework hooks alone, paired on one model: blocks of ``steps`` with the hooks installed
    and removed alternately (order flipped every pair), ratio of block medians per pair. Adjacent
    blocks (well under a second apart) see the same machine load, unlike whole configurations."""
    from trainguard.profiler.framework import TorchStepProfiler
    from trainguard.profiler.timeline import TimelineWriter

    torch.manual_seed(0)
    model = make_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    timeline = TimelineWriter(lambda key, data: None, 0, "bench")

    def block() -> float:
        times = []
        for index in range(steps):
            x, y = data[index % len(data)]
            start = time.perf_counter()
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    block()  # warm-up
    ratios = []
    for pair in range(pairs):
        medians = {}
        for hooked in (pair % 2 == 0, pair % 2 == 1):
            profiler = TorchStepProfiler(timeline).install() if hooked else None
            medians[hooked] = block()
            if profiler is not None:
                profiler.close()
            timeline.rotate()
        ratios.append(medians[True] / medians[False])
    return ratios


def sample_cost(samples: int, out_root: str) -> tuple[float, float, int]:
    """Mean wall and CPU seconds per system sample (read counters + format + append the lines)."""
    host, gpus = HostSampler(), GpuSampler()
    output = LocalOutput(Path(tempfile.mkdtemp(dir=out_root)) / "profiler-output")
    writer = SystemMetricsWriter(output, "bench")
    writer.write_sample(time.time(), host.sample(time.time()))  # prime the rate counters
    start, cpu_start = time.perf_counter(), time.process_time()
    records = 0
    for _ in range(samples):
        now = time.time()
        metrics = host.sample(now) + gpus.sample()
        writer.write_sample(now, metrics)
        records = len(metrics)
    elapsed = (time.perf_counter() - start) / samples
    cpu_elapsed = (time.process_time() - cpu_start) / samples
    writer.close()
    output.close()
    gpus.close()
    return elapsed, cpu_elapsed, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--steps", type=int)
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 30)
    steps = args.steps or (50 if args.quick else 60)
    warmup = 20
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    data = [(torch.randn(BATCH, 1, 28, 28, generator=generator), torch.randint(0, 10, (BATCH,), generator=generator))
            for _ in range(N_BATCHES)]  # fmt: skip

    medians: dict[str, list[float]] = {name: [] for name in CONFIGS}
    means: dict[str, list[float]] = {name: [] for name in CONFIGS}
    ratios: dict[str, list[float]] = {name: [] for name in CONFIGS}
    cpu: dict[str, list[float]] = {name: [] for name in CONFIGS}
    cpu_ratios: dict[str, list[float]] = {name: [] for name in CONFIGS}
    thread_shares: dict[str, list[float]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="tg-profiler-bench-") as out_root:
        for round_index in range(rounds):
            order = list(CONFIGS) if round_index % 2 == 0 else list(reversed(CONFIGS))
            result = {}
            for name in order:
                times, cpu_per_step, thread_share = measure(CONFIGS[name], steps, warmup, data, out_root)
                result[name] = (statistics.median(times), statistics.fmean(times), cpu_per_step)
                thread_shares[name].append(thread_share)
            for name, (median, mean, cpu_per_step) in result.items():
                medians[name].append(median)
                means[name].append(mean)
                ratios[name].append(median / result["none"][0])
                cpu[name].append(cpu_per_step)
                cpu_ratios[name].append(cpu_per_step / result["none"][2])
            summary = ", ".join(f"{name} {result[name][0] * 1000:.2f} ms" for name in CONFIGS)
            print(f"round {round_index + 1}/{rounds}: {summary}", file=sys.stderr, flush=True)
        per_sample, cpu_per_sample, records = sample_cost(500, out_root)
    ab = hooks_ab(4 if args.quick else 40, 30, data)

    print(f"\nreference CNN, batch {BATCH}, 1 torch thread, {rounds} rounds x {steps} timed steps "
          f"(+{warmup} warm-up), torch {torch.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    header = (
        "| configuration | median step (ms) | wall slowdown (median over rounds) | min..max | "
        "CPU per step (ms) | CPU-time slowdown (median) | min..max | profiler thread CPU (% of wall) |"
    )
    rows = [header, "|---|---|---|---|---|---|---|---|"]
    for name in CONFIGS:
        r, c = ratios[name], cpu_ratios[name]
        rows.append(
            f"| {name} | {statistics.median(medians[name]) * 1000:.2f} | {statistics.median(r):.3f}x | "
            f"{min(r):.3f}..{max(r):.3f} | {statistics.median(cpu[name]) * 1000:.2f} | {statistics.median(c):.3f}x | "
            f"{min(c):.3f}..{max(c):.3f} | {100 * statistics.median(thread_shares[name]):.3f} |"
        )
    print("\n".join(rows))
    print(f"\none system sample ({records} records: read /proc, NVML if present, append lines): "
          f"{cpu_per_sample * 1e6:.0f} us CPU ({per_sample * 1e6:.0f} us wall) = "
          f"{100 * cpu_per_sample / 0.1:.3f}% of one core at 100 ms, "
          f"{100 * cpu_per_sample / 0.5:.3f}% at 500 ms")  # fmt: skip
    low, _, high = statistics.quantiles(ab, n=4)
    print(f"framework hooks alone, paired A/B on one model ({len(ab)} pairs x 30 steps): slowdown median "
          f"{statistics.median(ab):.3f}x, quartiles {low:.3f}..{high:.3f}x")  # fmt: skip


if __name__ == "__main__":
    main()
