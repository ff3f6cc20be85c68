"""A two-layer graph convolution (Kipf & Welling style) whose parameters are bare ``nn.Parameter``s
named ``kernel`` and ``offset``: no ``weight`` or ``bias`` in any parameter name.

Node features are sparse and row-normalised (the standard preprocessing), the adjacency is the
symmetrically normalised one with self-loops, training is full-batch (one optimizer step per
epoch) with a validation pass each epoch. ``--lr`` and ``--freeze`` make the fault twins.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=200)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--nodes", type=int, default=300)
args = parser.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)

classes, features, nodes = 4, 64, args.nodes
labels = torch.randint(0, classes, (nodes,))
# class-dependent sparse bag-of-words features, then row-normalised
centres = (torch.rand(classes, features) < 0.15).float()
raw = ((torch.rand(nodes, features) < 0.05).float() + centres[labels] * (torch.rand(nodes, features) < 0.6)).clamp(max=1)
raw[raw.sum(1) == 0, 0] = 1.0
x = raw / raw.sum(1, keepdim=True)
# homophilous random graph: most edges join nodes of the same class
same = labels[:, None] == labels[None, :]
adjacency = ((torch.rand(nodes, nodes) < torch.where(same, 0.04, 0.004)) | torch.eye(nodes, dtype=torch.bool)).float()
adjacency = ((adjacency + adjacency.T) > 0).float()
degree = adjacency.sum(1).rsqrt()
adjacency = degree[:, None] * adjacency * degree[None, :]
train_mask = torch.arange(nodes) < nodes // 2
val_mask = ~train_mask


class GraphConvolution(nn.Module):
    def __init__(self, fan_in: int, fan_out: int) -> None:
        super().__init__()
        self.kernel = nn.Parameter(torch.empty(fan_in, fan_out))
        self.offset = nn.Parameter(torch.zeros(fan_out))
        nn.init.xavier_uniform_(self.kernel)

    def forward(self, h: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return a @ (h @ self.kernel) + self.offset


class GCN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer1 = GraphConvolution(features, 16)
        self.layer2 = GraphConvolution(16, classes)

    def forward(self, h: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        h = F.dropout(F.relu(self.layer1(h, a)), 0.5, self.training)
        return F.log_softmax(self.layer2(h, a), dim=1)


model = GCN()
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=5e-4)
for epoch in range(args.epochs):
    model.train()
    optimizer.zero_grad()
    output = model(x, adjacency)
    loss = F.nll_loss(output[train_mask], labels[train_mask])
    loss.backward()
    optimizer.step()
    model.eval()
    with torch.no_grad():
        output = model(x, adjacency)
        val_loss = F.nll_loss(output[val_mask], labels[val_mask])
        accuracy = (output[val_mask].argmax(1) == labels[val_mask]).float().mean()
print(f"done loss {loss.item():.4f} val {val_loss.item():.4f} acc {accuracy.item():.3f}")
