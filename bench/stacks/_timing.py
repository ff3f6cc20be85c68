"""What every stack script shares: its training loop's own wall time (start-up apart) and its device."""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
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
        # bench/instructions.py: count instructions under callgrind over the loop only (start-up,
        # imports and warm-up excluded) through a helper library issuing callgrind's requests
        toggle = os.environ.get("BENCH_CALLGRIND_TOGGLE")
        self._callgrind = ctypes.CDLL(toggle) if toggle else None
        if self._callgrind is not None:
            print(f"BENCH_LOOP_PID={os.getpid()}", flush=True)
            self._callgrind.bench_collect_on()
        self._usage = resource.getrusage(resource.RUSAGE_SELF)
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._synchronize()
        ended = time.perf_counter()
        if self._callgrind is not None:
            self._callgrind.bench_collect_off()
        # bench/real_stacks.py reads these lines from stdout; the span's ends are CLOCK_MONOTONIC
        # (perf_counter on Linux), comparable across processes (bench/time_slices.py)
        print(f"BENCH_LOOP_SECONDS={ended - self.started:.4f}", flush=True)
        print(f"BENCH_LOOP_SPAN={self.started:.6f} {ended:.6f}", flush=True)
        # where the loop's time went in this process: user and kernel CPU seconds, page faults
        # and context switches (a cost the instruction count of bench/instructions.py cannot see)
        usage, before = resource.getrusage(resource.RUSAGE_SELF), self._usage
        print(
            f"BENCH_LOOP_USAGE=user {usage.ru_utime - before.ru_utime:.4f} sys {usage.ru_stime - before.ru_stime:.4f} "
            f"minflt {usage.ru_minflt - before.ru_minflt} majflt {usage.ru_majflt - before.ru_majflt} "
            f"nvcsw {usage.ru_nvcsw - before.ru_nvcsw} nivcsw {usage.ru_nivcsw - before.ru_nivcsw}",
            flush=True,
        )

    def _synchronize(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
