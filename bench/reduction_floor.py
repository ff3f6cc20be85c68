"""What any hook must pay for "reductions of weights and gradients every step", and where.

    python bench/reduction_floor.py               # the MLP of bench/overhead.py (5 rounds)
    python bench/reduction_floor.py --model cnn   # the reference CNN

No debugger hook runs here. Each variant adds one piece of work to the bare training step of the
bench/overhead.py model (batch 64, one torch thread) and reports the step time relative to the
bare step, interleaved over rounds (median of rounds):

  read once          one float32 pass over every weight and gradient (``dot`` with itself): the
                     least any reduction must do, whoever computes it, on this thread
  reductions (sync)  min, max, mean, std and l2 of every weight and gradient, on this thread,
                     with trainguard's CPU kernels, batched (trainguard.hooks.torch_reductions)
  copies             one host copy of every weight and gradient (what an asynchronous writer
                     needs, since the optimizer changes them right after)
  py thread 20%      a thread of this process running pure Python 20 % of the time (a writer
                     thread encoding records): it competes for the GIL with the training loop
  process 100%       a separate process busy all the time: it competes for nothing but the CPU

The targets of the core issue ask for reductions every step at <= 1.05x. The first rows show
whether that is possible at all for a model, on this machine.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _overhead_worker import BATCH, make_model  # noqa: E402

from trainguard.hooks.torch_reductions import compute_reductions_many  # noqa: E402

REQUESTED = (("min", False), ("max", False), ("mean", False), ("std", False), ("l2", False))


def _busy_process(stop: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    while not stop.is_set():
        sum(range(10_000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=0, help="timed steps per variant and round (default by model)")
    args = parser.parse_args()
    steps = args.steps or (400 if args.model == "mlp" else 60)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = [(torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))) for _ in range(16)]
    model = make_model(args.model)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    parameters = list(model.parameters())

    def tensors() -> list[torch.Tensor]:
        return [p.detach() for p in parameters] + [p.grad for p in parameters if p.grad is not None]

    def read_once() -> None:
        for tensor in tensors():
            flat = tensor.reshape(-1)
            torch.dot(flat, flat)

    def reductions_sync() -> None:
        compute_reductions_many(tensors(), REQUESTED)

    def copies() -> None:
        for tensor in tensors():
            tensor.clone()

    def run(extra, count: int) -> float:
        times = []
        for index in range(count):
            x, y = data[index % len(data)]
            start = time.perf_counter()
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            if extra is not None:
                extra()
            optimizer.step()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def with_python_thread(duty: float):
        def variant(count: int) -> float:
            stop = threading.Event()

            def busy() -> None:
                while not stop.is_set():
                    began = time.perf_counter()
                    while time.perf_counter() - began < duty * 1e-3:
                        sum(range(100))
                    time.sleep((1 - duty) * 1e-3)

            thread = threading.Thread(target=busy, daemon=True)
            thread.start()
            try:
                return run(None, count)
            finally:
                stop.set()
                thread.join()

        return variant

    def with_busy_process(count: int) -> float:
        stop = multiprocessing.Event()
        process = multiprocessing.Process(target=_busy_process, args=(stop,), daemon=True)
        process.start()
        time.sleep(0.2)
        try:
            return run(None, count)
        finally:
            stop.set()
            process.join()

    variants = {
        "bare": lambda n: run(None, n),
        "read once": lambda n: run(read_once, n),
        "reductions (sync)": lambda n: run(reductions_sync, n),
        "copies": lambda n: run(copies, n),
        "py thread 20%": with_python_thread(0.2),
        "process 100%": with_busy_process,
    }
    run(None, 30)  # warm-up
    results: dict[str, list[float]] = {name: [] for name in variants}
    for round_index in range(args.rounds):
        order = list(variants) if round_index % 2 == 0 else list(reversed(variants))
        for name in order:
            results[name].append(variants[name](steps))
    bare = statistics.median(results["bare"])
    n_values = sum(t.numel() for t in tensors())
    print(f"model={args.model} rounds={args.rounds} steps={steps} batch={BATCH} threads=1 "
          f"weights+gradients={n_values:,} values; bare step {bare * 1e3:.3f} ms")  # fmt: skip
    print("| variant | step (ms) | vs bare |")
    print("|---|---|---|")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"| {name} | {median * 1e3:.3f} | {median / bare:.2f}x |")


if __name__ == "__main__":
    main()
