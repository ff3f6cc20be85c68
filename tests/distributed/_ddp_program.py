"""A small data-parallel training program (torchrun, gloo, CPU) with switches for the faults
that make replicas drift apart, and for the healthy variants that must not look like them.

    torchrun --nproc_per_node 2 _ddp_program.py --fault nudge --fault-rank 1 --fault-step 7

Faults (on ``--fault-rank`` from ``--fault-step`` on, unless said otherwise):

* ``nudge``: one weight moved by 1e-3 right after the optimizer step;
* ``outside``: a head module trained outside the DDP module (same initial values on every rank,
  its gradients never all-reduced);
* ``no_sync``: every rank accumulates under ``no_sync()`` and never leaves it, so no gradient is
  ever all-reduced (one rank alone in ``no_sync`` would leave the other waiting in its
  all-reduce for ever: a hang, not a divergence);
* ``seeds``: every rank seeded with its rank, the model not wrapped in DDP (nothing broadcasts
  the initial values) and its gradients all-reduced by hand;
* ``skip_step``: that rank skips ``optimizer.step()`` on every third step.

Healthy variants: ``--accumulate K`` (K micro-batches per step, the first K-1 under
``no_sync()``), ``--batchnorm`` (BatchNorm1d, buffers broadcast by DDP), ``--bf16`` (CPU autocast).
Each rank trains on batches of its own. Prints ``training completed`` at the end.

``--hook-dir DIR``: the script's own ``Hook(DIR)`` with smdebug's defaults (collections,
``include_workers="one"``) and saves every ``--hook-interval`` steps, instead of zero-code capture.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def _body(batchnorm: bool) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(8, 32)]
    if batchnorm:
        layers.append(nn.BatchNorm1d(32))
    layers += [nn.ReLU(), nn.Linear(32, 16), nn.ReLU()]
    return nn.Sequential(*layers)


class Net(nn.Module):
    def __init__(self, batchnorm: bool) -> None:
        super().__init__()
        self.body = _body(batchnorm)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", default="none", choices=["none", "nudge", "outside", "no_sync", "seeds", "skip_step"])
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--fault-step", type=int, default=7)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--batchnorm", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step (time for a stop to arrive)")
    parser.add_argument("--hook-dir", default=None)
    parser.add_argument("--hook-interval", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(rank if args.fault == "seeds" else 0)
    if args.fault == "outside":
        body = DistributedDataParallel(_body(args.batchnorm))
        head = nn.Linear(16, 1)  # outside the DDP module: its gradients stay local

        def model(x: torch.Tensor) -> torch.Tensor:
            return head(body(x))

        parameters = [*body.parameters(), *head.parameters()]
        ddp = body
    elif args.fault == "seeds":
        net = Net(args.batchnorm)
        model, parameters, ddp = net, list(net.parameters()), None
    else:
        ddp = DistributedDataParallel(Net(args.batchnorm))
        model, parameters = ddp, list(ddp.parameters())
    hook = None
    if args.hook_dir:
        import trainguard.pytorch as tg

        hook = tg.Hook(args.hook_dir, save_config=tg.SaveConfig(save_interval=args.hook_interval))
        hook.register_module(ddp if ddp is not None else model)
    optimizer = torch.optim.SGD(parameters, lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1000 + rank)  # every rank its own batches
    faulty = rank == args.fault_rank
    for step in range(args.steps):
        optimizer.zero_grad()
        for micro in range(args.accumulate):
            x = torch.randn(16, 8, generator=data)
            y = x[:, :1] * 2.0 - x[:, 1:2]
            last = micro == args.accumulate - 1
            syncing = last and args.fault != "no_sync"
            context = ddp.no_sync() if ddp is not None and not syncing else contextlib.nullcontext()
            autocast = torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
            with context:
                with autocast:
                    out = model(x)
                loss = nn.functional.mse_loss(out.float(), y) / args.accumulate
                loss.backward()
        if args.fault == "seeds":
            for parameter in parameters:  # a hand-written data-parallel step: gradients averaged
                dist.all_reduce(parameter.grad)
                parameter.grad /= dist.get_world_size()
        if not (args.fault == "skip_step" and faulty and step >= args.fault_step and step % 3 == 0):
            optimizer.step()
        if args.fault == "nudge" and faulty and step == args.fault_step:
            with torch.no_grad():
                parameters[0][0, 0] += 1e-3
        time.sleep(args.sleep)
    if hook is not None:
        hook.close()
    dist.barrier()
    if rank == 0:
        print("training completed", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
