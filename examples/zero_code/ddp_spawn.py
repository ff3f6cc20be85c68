"""A plain PyTorch DistributedDataParallel script on CPU: it starts 2 ranks itself
(torch.multiprocessing.spawn) and trains with the gloo backend.

No trainguard code. Capture every rank with a hook config that says include_workers "all":

    echo '{"HookParameters": {"include_workers": "all"}}' > hook.json
    trainguard run --out runs/ddp --config hook.json -- python examples/zero_code/ddp_spawn.py

The spawned ranks inherit trainguard's environment, so each captures itself as worker_<rank>.
"""

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def train(rank: int, world_size: int, port: int, steps: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DistributedDataParallel(Net())
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(100 + rank)
    for step in range(steps):
        x, y = torch.randn(8, 4, generator=generator), torch.randn(8, 2, generator=generator)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        # one write per line: the ranks share stdout, and print() writes the newline separately
        sys.stdout.write(f"rank {rank} train_loss {step} {loss.item().hex()}\n")
        sys.stdout.flush()
    dist.barrier()
    # Drop DDP's reducer before the process group: if the reducer holds the group's last
    # reference, tearing it down joins gloo's worker thread while holding the GIL, and a worker
    # still waiting for the GIL deadlocks the rank (a PyTorch race seen under CPU starvation).
    del model, optimizer
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    mp.spawn(train, args=(args.world_size, free_port(), args.steps), nprocs=args.world_size)
    print(f"optimizer_steps {args.steps}")


if __name__ == "__main__":
    main()
