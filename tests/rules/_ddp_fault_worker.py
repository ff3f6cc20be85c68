"""One rank of a 2-process gloo DDP job whose rank 1 alone logs a -inf loss from step 3 on.

Started by test_every_worker.py. Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
Argument: out_dir. The planted fault is in what rank 1's loss module returns (its value is
-inf), not in what is backpropagated (a constant offset has no gradient): gradients, weights and
every tensor of rank 0 stay finite, so only a rule that reads worker_1 can find it.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

import trainguard.pytorch as tg

STEPS = 8
FAULT_FROM_STEP = 3


class OffsetMSELoss(nn.Module):
    """MSE plus a constant offset (0, or -inf on the faulty rank)."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = 0.0

    def forward(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(prediction, target) + self.offset


def main() -> None:
    out_dir = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    ddp = DistributedDataParallel(model)
    criterion = OffsetMSELoss()
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    hook = tg.Hook(out_dir=out_dir, include_workers="all", save_config=tg.SaveConfig(save_interval=1))
    hook.register_module(model)
    hook.register_loss(criterion)
    generator = torch.Generator().manual_seed(100 + rank)
    for step in range(STEPS):
        x, y = torch.randn(16, 4, generator=generator), torch.randn(16, 2, generator=generator)
        criterion.offset = float("-inf") if rank == 1 and step >= FAULT_FROM_STEP else 0.0
        optimizer.zero_grad()
        loss = criterion(ddp(x), y)
        loss.backward()
        optimizer.step()
    hook.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
