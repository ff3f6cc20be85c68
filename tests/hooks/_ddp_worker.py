"""One rank of a 2-process gloo job using the explicit hook (started by test_distributed.py).

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; optional TG_TEST_LATE_RANK (that rank
ends its capture 2 s after the others) and TG_TEST_CLOSE_AT_EXIT=1 (no hook.close(): the hook
closes at interpreter exit). Arguments: out_dir include_workers expected_file. Writes, per step, what the model really used (weights at step start, the
gradient the optimizer applied, the loss) to expected_file for the test to compare with.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

import trainguard.pytorch as tg


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def main() -> None:
    out_dir, include_workers, expected_file = sys.argv[1:4]
    # optional 4th argument: the collections ranks > 0 save under "one" ("none": nothing)
    others = sys.argv[4] if len(sys.argv) > 4 else None
    other_workers_collections = None if others is None else [] if others == "none" else others.split(",")
    steps = 3
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # same initial weights on every rank
    model = Net()
    ddp = DistributedDataParallel(model)
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    hook = tg.Hook(out_dir=out_dir, include_workers=include_workers, save_config=tg.SaveConfig(save_interval=1),
                   other_workers_collections=other_workers_collections)  # fmt: skip
    hook.register_module(model)
    hook.register_loss(criterion)
    generator = torch.Generator().manual_seed(100 + rank)  # different data on each rank
    expected = []
    for _ in range(steps):
        x, y = torch.randn(8, 4, generator=generator), torch.randn(8, 2, generator=generator)
        weights = model.fc1.weight.detach().clone()
        optimizer.zero_grad()
        loss = criterion(ddp(x), y)
        loss.backward()
        expected.append({"weight": weights, "grad": model.fc1.weight.grad.detach().clone(), "loss": loss.item()})
        optimizer.step()
    late = os.environ.get("TG_TEST_LATE_RANK") == str(rank)
    at_exit = os.environ.get("TG_TEST_CLOSE_AT_EXIT") == "1"
    if not at_exit:
        if late:
            time.sleep(2.0)  # its last step is written at its close: after rank 0 closed
        hook.close()
    torch.save(expected, expected_file)
    dist.barrier()
    dist.destroy_process_group()
    if at_exit and late:
        time.sleep(2.0)  # the hook closes at exit, 2 s after rank 0's did
    print(f"rank {rank} done, pid {os.getpid()}", flush=True)


if __name__ == "__main__":
    main()
