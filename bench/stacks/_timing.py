"""What every stack script prints: its training loop's own wall time, apart from start-up."""

from __future__ import annotations

import time


class LoopTimer:
    def __enter__(self) -> LoopTimer:
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        # bench/real_stacks.py reads this line from stdout
        print(f"BENCH_LOOP_SECONDS={time.perf_counter() - self.started:.4f}", flush=True)
