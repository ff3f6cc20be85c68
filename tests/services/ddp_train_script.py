"""A plain 1-process-per-instance PyTorch DDP (gloo) script, no trainguard code, no torchrun.

Reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (what the Ray launcher's ray_ranks gives each
instance) through ``init_process_group("gloo")``. ``--fault-rank R --fault-from N`` adds a 1e6
offset to rank R's loss from step N on (no gradient: the other rank's tensors stay healthy), so
only a rule reading worker_R finds it. ``--nudge-rank R --nudge-at N`` moves one weight of rank
R's replica by 1e-3 after step N's update: the replicas drift apart, every metric stays normal.
Prints the SageMaker host view it was given.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


class OffsetMSELoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.offset = 0.0

    def forward(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(prediction, target) + self.offset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--fault-rank", type=int, default=-1)
    parser.add_argument("--fault-from", type=int, default=0)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--nudge-rank", type=int, default=-1)
    parser.add_argument("--nudge-at", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world}: SM_CURRENT_HOST={os.environ.get('SM_CURRENT_HOST')} "
          f"SM_HOSTS={os.environ.get('SM_HOSTS')} MASTER={os.environ.get('MASTER_ADDR')}", flush=True)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
    criterion = OffsetMSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(100 + rank)
    for step in range(args.steps):
        inputs = torch.randn(32, 4, generator=generator)
        criterion.offset = 1e6 if rank == args.fault_rank and step >= args.fault_from else 0.0
        optimizer.zero_grad()
        loss = criterion(model(inputs), inputs.sum(dim=1, keepdim=True))
        loss.backward()
        optimizer.step()
        if rank == args.nudge_rank and step == args.nudge_at:
            with torch.no_grad():
                model.module[0].weight[0, 0] += 1e-3
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(args.step_seconds)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
