"""What every stack script shares: its training loop's own wall time (start-up apart) and its device."""

from __future__ import annotations

import argparse
import time


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: model and batches on the GPU (bench/real_stacks.py --device cuda)")  # fmt: skip


class LoopTimer:
    """Prints the loop's seconds; on CUDA after the queued kernels finished, so the figure is the
    GPU's work too and not only the time to queue it."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def __enter__(self) -> LoopTimer:
        self._synchronize()
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._synchronize()
        # bench/real_stacks.py reads this line from stdout
        print(f"BENCH_LOOP_SECONDS={time.perf_counter() - self.started:.4f}", flush=True)

    def _synchronize(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
