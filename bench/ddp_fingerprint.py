"""What the replica fingerprint (src/trainguard/hooks/torch_fingerprint.py) costs a training step,
on the DDP setup (2 ranks, gloo, CPU, one thread each) and in a single process.

Per model, each rank trains plain steps (DDP forward, backward with its all-reduce, optimizer
step) and times them (the training thread's CPU time: seconds another process holds the core are
no step time); then it times one fingerprint as the hook takes it on a due step: the reductions of
every gradient and of every parameter (``PendingRows``: the wrapping sum of the raw bits, the
norms) and their one read-back (``read_rows``), the best of repeated timings, which load only
lengthens. The step's wall time is printed beside (a DDP step also waits for its all-reduce,
which the thread's CPU time leaves out: the figure against it is the smaller one). The figure is the fingerprint's share
of training at a given interval: ``fingerprint / (interval x step)``, with the hook's default
save interval 10 (a fingerprint on every saved step) and per fingerprinted step alone
(``interval 1``). The handing of the two small arrays to the writer is not in it (a few
microseconds next to a saved step's own tensors).

    python bench/ddp_fingerprint.py                 # mlp (bench/stacks/mlp.py's sizes) and wide
    python bench/ddp_fingerprint.py --steps 200 --record
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainguard.hooks.torch_fingerprint import PendingRows, bit_words, read_rows  # noqa: E402

MODELS = {
    # bench/stacks/mlp.py's model; a wider one with about 2.2M parameters
    "mlp": ((64, 128, 128, 10), 256),
    "wide": ((256, 1024, 1024, 1024, 10), 256),
}


def _model(sizes: tuple[int, ...]) -> nn.Module:
    layers: list[nn.Module] = []
    for index in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[index], sizes[index + 1]))
        if index < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def measure(name: str, steps: int, distributed: bool) -> dict[str, float]:
    sizes, batch = MODELS[name]
    torch.manual_seed(0)
    model = _model(sizes)
    trained = DistributedDataParallel(model) if distributed else model
    optimizer = torch.optim.Adam(trained.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    inputs = torch.randn(batch, sizes[0])
    labels = torch.randint(0, sizes[-1], (batch,))
    times, walls = [], []
    for step in range(steps + 5):
        start, began = time.thread_time(), time.perf_counter()
        optimizer.zero_grad()
        criterion(trained(inputs), labels).backward()
        optimizer.step()
        if step >= 5:
            times.append(time.thread_time() - start)
            walls.append(time.perf_counter() - began)
    parameters = list(model.parameters())
    words = [bit_words(parameter.detach()) for parameter in parameters]  # made once, as the hook does
    takes = []
    for _ in range(30):
        start = time.thread_time()
        gradients = PendingRows([parameter.grad for parameter in parameters])
        read_rows(PendingRows(parameters, words), gradients)
        takes.append(time.thread_time() - start)
    return {
        "step_ms": statistics.median(times) * 1e3,
        "wall_step_ms": statistics.median(walls) * 1e3,
        "fingerprint_ms": min(takes) * 1e3,
        "parameters": sum(parameter.numel() for parameter in parameters),
    }


def _rank(rank: int, world: int, init: str, steps: int, results: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    for name in MODELS:
        results[(rank, name)] = measure(name, steps, distributed=True)
    dist.destroy_process_group()


def report(label: str, name: str, figures: dict[str, float], interval: int) -> str:
    share = figures["fingerprint_ms"] / (interval * figures["step_ms"]) * 100
    per_step = figures["fingerprint_ms"] / figures["step_ms"] * 100
    return (
        f"{label:<14} {name:<5} {figures['parameters']:>9,d} params  step {figures['step_ms']:7.3f} ms "
        f"(wall {figures['wall_step_ms']:7.3f})  "
        f"fingerprint {figures['fingerprint_ms']:6.3f} ms = {per_step:5.2f} % of a step, "
        f"{share:5.3f} % at interval {interval}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--interval", type=int, default=10, help="steps per fingerprint (the save interval)")
    parser.add_argument("--record", action="store_true", help="write the figures into bench/RESULTS.md")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    lines = []
    single = {name: measure(name, args.steps, distributed=False) for name in MODELS}
    with tempfile.TemporaryDirectory() as directory, mp.Manager() as manager:
        results = manager.dict()
        init = f"file://{directory}/rendezvous"
        mp.spawn(_rank, args=(2, init, args.steps, results), nprocs=2, join=True)
        ddp = {name: results[(0, name)] for name in MODELS}
        ddp_other = {name: results[(1, name)] for name in MODELS}
    for name in MODELS:
        lines.append(report("single process", name, single[name], args.interval))
        lines.append(report("DDP rank 0", name, ddp[name], args.interval))
        lines.append(report("DDP rank 1", name, ddp_other[name], args.interval))
    load = os.getloadavg()[0]
    print(f"load {load:.1f}")
    print("\n".join(lines))
    if args.record:
        from bench.results_table import record

        command = f"python bench/ddp_fingerprint.py --steps {args.steps} --interval {args.interval}"
        for name in MODELS:
            for label, figures in (("single process", single[name]), ("2-rank gloo DDP", ddp[name])):
                share = figures["fingerprint_ms"] / (args.interval * figures["step_ms"]) * 100
                record(
                    section="Replica fingerprint cost",
                    figure=(f"{label}, {name} ({figures['parameters']:,d} params), "
                            f"fingerprint every {args.interval} steps"),
                    value=round(share, 3),
                    unit="% of training",
                    command=command,
                    note=(f"fingerprint {figures['fingerprint_ms']:.3f} ms (params + grads, best of 30), "
                          f"step {figures['step_ms']:.3f} ms (median thread CPU; wall {figures['wall_step_ms']:.3f} ms: "
                          f"{figures['fingerprint_ms'] / (args.interval * figures['wall_step_ms']) * 100:.3f} %), "
                          f"load {load:.1f}"),
                )  # fmt: skip


if __name__ == "__main__":
    main()
