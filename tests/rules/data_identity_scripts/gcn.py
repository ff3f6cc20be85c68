"""A 2-layer graph convolution network as Kipf & Welling's reference code trains one (pygcn): sparse
bag-of-words node features, row-normalised (``D⁻¹X``: each node's features sum to 1), a
symmetrically normalised adjacency with self-loops as a sparse tensor, full-batch Adam with
weight decay and dropout, the loss on the labelled nodes only. The graph is synthetic: nodes of a
class share words and link mostly within their class."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=200)
parser.add_argument("--dense-adjacency", action="store_true")
args = parser.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
NODES, WORDS, CLASSES = 300, 600, 3

labels = torch.randint(0, CLASSES, (NODES,))
topic = torch.rand(CLASSES, WORDS) < 0.03
words = (torch.rand(NODES, WORDS) < 0.005) | (topic[labels] & (torch.rand(NODES, WORDS) < 0.5))
features = words.float()
features = features / features.sum(1, keepdim=True).clamp(min=1)  # row-normalise, as pygcn does
same = labels[:, None] == labels[None, :]
links = torch.rand(NODES, NODES) < torch.where(same, torch.tensor(0.04), torch.tensor(0.002))
adjacency = ((links | links.t()).float() + torch.eye(NODES))
degree = adjacency.sum(1).rsqrt()
adjacency = degree[:, None] * adjacency * degree[None, :]
if not args.dense_adjacency:
    adjacency = adjacency.to_sparse()
train = torch.zeros(NODES, dtype=torch.bool)
train[torch.randperm(NODES)[:120]] = True


class GraphConvolution(nn.Module):
    def __init__(self, inputs, outputs):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(inputs, outputs))
        self.bias = nn.Parameter(torch.zeros(outputs))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, x, adjacency):
        support = torch.mm(x, self.weight)
        return torch.spmm(adjacency, support) + self.bias if adjacency.is_sparse else adjacency @ support + self.bias


class GCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.gc1 = GraphConvolution(WORDS, 16)
        self.gc2 = GraphConvolution(16, CLASSES)

    def forward(self, x, adjacency):
        x = F.relu(self.gc1(x, adjacency))
        x = F.dropout(x, 0.5, training=self.training)
        return F.log_softmax(self.gc2(x, adjacency), dim=1)


model = GCN()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
for _ in range(args.epochs):
    model.train()
    optimizer.zero_grad()
    output = model(features, adjacency)
    loss = F.nll_loss(output[train], labels[train])
    loss.backward()
    optimizer.step()
model.eval()
with torch.no_grad():
    accuracy = (model(features, adjacency).argmax(1)[~train] == labels[~train]).float().mean().item()
print(f"done loss {loss.item():.3f} test accuracy {accuracy:.2f}")
