"""A small, real PyTorch training script for the stack's demos, tests and benchmark.

Plain PyTorch (no trainguard import): the image's entrypoint captures it with zero-code capture.
Regression on synthetic data; with ``--lr`` far too high the weights blow up to inf/NaN within a
few steps, which the ExplodingTensor and LossNotDecreasing rules catch.

It prints ``trainguard-demo: first non-finite loss at step S t=<epoch s>`` the first time the
loss is not finite (the benchmark times the stop from there) and keeps training until the steps
run out or it is stopped (SIGTERM ends it cleanly).
"""

import argparse
import math
import signal
import sys
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--step-sleep", type=float, default=0.1, help="seconds per step beyond the compute")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--fault-step", type=int, default=None, help="from this step on, train with --fault-lr")
parser.add_argument("--fault-lr", type=float, default=5.0, help="the far too high learning rate of the fault")
args = parser.parse_args()

stopping = False


def _stop(signum, frame):  # noqa: ANN001
    global stopping
    stopping = True


signal.signal(signal.SIGTERM, _stop)

torch.manual_seed(args.seed)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
loss_fn = torch.nn.MSELoss()
inputs = torch.randn(256, 16)
targets = inputs @ torch.randn(16, 1) + 0.1 * torch.randn(256, 1)

reported = False
for step in range(args.steps):
    if stopping:
        print(f"trainguard-demo: stopped by SIGTERM at step {step}", flush=True)
        sys.exit(0)
    if args.fault_step is not None and step == args.fault_step:
        for group in optimizer.param_groups:
            group["lr"] = args.fault_lr
        print(f"trainguard-demo: learning rate set to {args.fault_lr} at step {step}", flush=True)
    batch = torch.randint(0, 256, (32,))
    optimizer.zero_grad()
    loss = loss_fn(model(inputs[batch]), targets[batch])
    loss.backward()
    optimizer.step()
    value = loss.item()
    if not math.isfinite(value) and not reported:
        reported = True
        print(f"trainguard-demo: first non-finite loss at step {step} t={time.time():.3f}", flush=True)
    if step % 10 == 0:
        print(f"step {step} loss {value:.4g}", flush=True)
    time.sleep(args.step_sleep)
print("trainguard-demo: done", flush=True)
