"""A small real PyTorch training run that writes a trainguard run directory, slowly enough
(``--step-sleep``) that an uploader following it sees the files appear while it runs."""

import argparse
import time

import torch

import trainguard.pytorch as tg

parser = argparse.ArgumentParser()
parser.add_argument("out_dir")
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--step-sleep", type=float, default=0.05)
parser.add_argument("--linger", type=float, default=0.0, help="seconds to stay after the hook's close")
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
loss_fn = torch.nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
hook = tg.Hook(
    args.out_dir, save_config=tg.SaveConfig(save_interval=1), include_collections=["weights", "gradients", "losses"]
)
hook.register_module(model)
hook.register_loss(loss_fn)
inputs, targets = torch.randn(64, 8), torch.randn(64, 1)
for _ in range(args.steps):
    optimizer.zero_grad()
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()
    time.sleep(args.step_sleep)
hook.close()
time.sleep(args.linger)
