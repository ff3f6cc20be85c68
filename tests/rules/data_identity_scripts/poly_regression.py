"""Polynomial regression as PyTorch's example (examples/regression) writes it: features x, x², x³, x⁴
of a standard normal x (x⁴: mean 3, std ~10, engineered, not unscaled), a linear model fitted with
smooth L1 loss and SGD at lr 0.1 to a random degree-4 polynomial with coefficients of about 5.
``--fault unscaled``: a fifth, informative feature left in raw units of 1e4."""

import argparse

import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--fault", choices=["none", "unscaled"], default="none")
args = parser.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
DEGREE = 4
width = DEGREE + (args.fault == "unscaled")
W_target = torch.randn(width, 1) * 5
b_target = torch.randn(1) * 5


def get_batch(batch_size=32):
    x = torch.randn(batch_size).unsqueeze(1)
    features = torch.cat([x**i for i in range(1, DEGREE + 1)], 1)
    if args.fault == "unscaled":
        raw = torch.randn(batch_size, 1)
        features = torch.cat([features, raw * 1e4], 1)
        return features, torch.cat([features[:, :DEGREE], raw], 1).mm(W_target) + b_target
    return features, features.mm(W_target) + b_target


fc = torch.nn.Linear(width, 1)
optimizer = torch.optim.SGD(fc.parameters(), lr=0.1)
for _ in range(args.steps):
    batch_x, batch_y = get_batch()
    loss = F.smooth_l1_loss(fc(batch_x), batch_y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"done loss {loss.item():.4f} weights {fc.weight.view(-1).tolist()} target {W_target.view(-1).tolist()}")
