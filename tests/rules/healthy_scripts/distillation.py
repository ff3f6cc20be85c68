"""Healthy knowledge distillation: a student learns a teacher's softened distribution (KLDivLoss)."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1500)
args = parser.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
teacher = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10)).eval()
student = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 10))
optimizer = torch.optim.SGD(student.parameters(), lr=0.1, momentum=0.9)
divergence, temperature = nn.KLDivLoss(reduction="batchmean"), 4.0
for _ in range(args.steps):
    x = torch.randn(64, 20)
    with torch.no_grad():
        target = F.softmax(teacher(x) / temperature, 1)
    optimizer.zero_grad()
    loss = divergence(F.log_softmax(student(x) / temperature, 1), target) * temperature**2
    loss.backward()
    optimizer.step()
print(f"done loss {loss.item():.4f}")
