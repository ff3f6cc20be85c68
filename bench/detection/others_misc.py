"""Four more kinds from public example collections, written anew in their idioms:

- LBFGS sequence prediction: two ``LSTMCell``s unrolled over sine waves in float64, a few
  ``optimizer.step(closure)`` calls (each evaluates the closure up to 20 times), a prediction
  of the future under ``no_grad`` after each step;
- a graph convolution (Kipf & Welling) with bare ``nn.Parameter``s named ``kernel``, a sparse
  row-normalised adjacency and row-normalised bag-of-words node features, full-batch training
  with a validation loss every epoch;
- a forward-forward network: each layer trained on its own (its own optimizer, the goodness
  loss), its ``forward`` called directly, the label overlaid on the first input pixels;
- polynomial regression: features x..x^4, a ``Linear(4, 1)`` from its small default init
  fitting coefficients of about 5, a hand-written SGD update, stopping once the loss is small.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from bench.detection.others_common import Capture, OthersSpec, freeze_all


def train_lbfgs_sine(out_dir: str, spec: OthersSpec) -> str:
    import torch
    from torch import nn

    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    T, L, N = 20, 32, 16
    x = np.arange(L) + rng.integers(-4 * T, 4 * T, size=(N, 1))
    data = torch.from_numpy(np.sin(x / 1.0 / T).astype("float64"))
    input, target = data[3:, :-1], data[3:, 1:]
    test_input, test_target = data[:3, :-1], data[:3, 1:]

    class Sequence(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm1 = nn.LSTMCell(1, 21)
            self.lstm2 = nn.LSTMCell(21, 21)
            self.linear = nn.Linear(21, 1)

        def forward(self, input, future=0):  # type: ignore[no-untyped-def]
            outputs = []
            h_t = torch.zeros(input.size(0), 21, dtype=torch.double)
            c_t = torch.zeros(input.size(0), 21, dtype=torch.double)
            h_t2 = torch.zeros(input.size(0), 21, dtype=torch.double)
            c_t2 = torch.zeros(input.size(0), 21, dtype=torch.double)
            for input_t in input.split(1, dim=1):
                h_t, c_t = self.lstm1(input_t, (h_t, c_t))
                h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
                output = self.linear(h_t2)
                outputs += [output]
            for _ in range(future):  # if we should predict the future
                h_t, c_t = self.lstm1(output, (h_t, c_t))
                h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
                output = self.linear(h_t2)
                outputs += [output]
            return torch.cat(outputs, dim=1)

    seq = Sequence().double()
    criterion = nn.MSELoss()
    if spec.freeze:
        freeze_all([seq])
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=spec.lr)
    capture = Capture(out_dir, spec)
    capture.start([seq], [criterion])
    try:
        for _ in range(spec.steps):

            def closure():  # type: ignore[no-untyped-def]
                optimizer.zero_grad()
                out = seq(input)
                loss = criterion(out, target)
                loss.backward()
                return loss

            loss = optimizer.step(closure)
            capture.losses.append(float(loss.detach()))
            with torch.no_grad():  # begin to predict, no need to track gradient here
                future = 20
                pred = seq(test_input, future=future)
                capture.val_losses.append((len(capture.losses), float(criterion(pred[:, :-future], test_target))))
    finally:
        out = capture.finish()
    return out


def _planted_graph(rng: np.random.Generator, nodes: int, classes: int, words: int) -> tuple[Any, Any, Any]:
    """A stochastic block model with class-topical bag-of-words features."""
    labels = rng.integers(0, classes, size=nodes)
    same = labels[:, None] == labels[None, :]
    edges = rng.random((nodes, nodes)) < np.where(same, 0.04, 0.004)
    adjacency = np.triu(edges, 1)
    adjacency = (adjacency | adjacency.T).astype(np.float32)
    topic = rng.integers(0, classes, size=words)
    chance = np.where(topic[None, :] == labels[:, None], 0.08, 0.01)
    features = (rng.random((nodes, words)) < chance).astype(np.float32)
    return features, adjacency, labels


def _row_normalise(matrix: np.ndarray) -> np.ndarray:
    rowsum = matrix.sum(1, keepdims=True)
    return matrix / np.where(rowsum == 0, 1.0, rowsum)


def train_gcn(out_dir: str, spec: OthersSpec) -> str:
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    features_np, adjacency_np, labels_np = _planted_graph(rng, 300, 4, 400)
    features = torch.from_numpy(_row_normalise(features_np))
    adj = torch.from_numpy(_row_normalise(adjacency_np + np.eye(len(adjacency_np), dtype=np.float32))).to_sparse()
    labels = torch.from_numpy(labels_np)
    idx_train, idx_val = torch.arange(0, 80), torch.arange(80, 180)

    class GraphConvolution(nn.Module):
        def __init__(self, in_features: int, out_features: int) -> None:
            super().__init__()
            self.kernel = nn.Parameter(torch.empty(in_features, out_features))
            stdv = 1.0 / math.sqrt(out_features)
            self.kernel.data.uniform_(-stdv, stdv)

        def forward(self, input, adj):  # type: ignore[no-untyped-def]
            return torch.spmm(adj, torch.mm(input, self.kernel))

    class GCN(nn.Module):
        def __init__(self, nfeat: int, nhid: int, nclass: int, dropout: float) -> None:
            super().__init__()
            self.gc1 = GraphConvolution(nfeat, nhid)
            self.gc2 = GraphConvolution(nhid, nclass)
            self.dropout = dropout

        def forward(self, x, adj):  # type: ignore[no-untyped-def]
            x = F.relu(self.gc1(x, adj))
            x = F.dropout(x, self.dropout, training=self.training)
            return F.log_softmax(self.gc2(x, adj), dim=1)

    model = GCN(features.shape[1], 16, 4, 0.5)
    nll = nn.NLLLoss()
    if spec.freeze:
        freeze_all([model])
    optimizer = torch.optim.Adam(model.parameters(), lr=spec.lr, weight_decay=5e-4)
    capture = Capture(out_dir, spec)
    capture.start([model], [nll])
    try:
        for epoch in range(spec.steps):
            model.train()
            optimizer.zero_grad()
            output = model(features, adj)
            loss_train = nll(output[idx_train], labels[idx_train])
            loss_train.backward()
            optimizer.step()
            capture.losses.append(float(loss_train.item()))
            model.eval()  # the validation loss of every epoch, dropout off
            with torch.no_grad():
                output = model(features, adj)
                capture.val_losses.append((epoch, float(nll(output[idx_val], labels[idx_val]).item())))
    finally:
        out = capture.finish()
    return out


def train_forward_forward(out_dir: str, spec: OthersSpec) -> str:
    import torch
    from torch import nn

    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    teacher = np.random.default_rng(7)
    classes, dims = 10, 64
    prototypes = teacher.normal(scale=1.0, size=(classes, dims))
    y_np = rng.integers(0, classes, size=512)
    x_np = (prototypes[y_np] + rng.normal(scale=0.7, size=(512, dims))).astype(np.float32)
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)

    def overlay_y_on_x(x, y):  # type: ignore[no-untyped-def]
        x_ = x.clone()
        x_[:, :classes] *= 0.0
        x_[range(x.shape[0]), y] = x.max()
        return x_

    class Layer(nn.Linear):
        def __init__(self, in_features: int, out_features: int) -> None:
            super().__init__(in_features, out_features)
            self.relu = nn.ReLU()
            self.opt = torch.optim.Adam(self.parameters(), lr=spec.lr)
            self.threshold = 2.0

        def forward(self, x):  # type: ignore[no-untyped-def]
            x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
            return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

        def train_layer(self, x_pos, x_neg, epochs):  # type: ignore[no-untyped-def]
            for _ in range(epochs):
                g_pos = self.forward(x_pos).pow(2).mean(1)
                g_neg = self.forward(x_neg).pow(2).mean(1)
                # push positive goodness above the threshold and negative goodness below it
                loss = torch.log(1 + torch.exp(torch.cat([-g_pos + self.threshold, g_neg - self.threshold]))).mean()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                capture.losses.append(float(loss.item()))
            return self.forward(x_pos).detach(), self.forward(x_neg).detach()

    class Net(nn.Module):
        def __init__(self, dims: list[int]) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Layer(dims[d], dims[d + 1]) for d in range(len(dims) - 1))

        def predict(self, x):  # type: ignore[no-untyped-def]
            goodness_per_label = []
            for label in range(classes):
                h = overlay_y_on_x(x, label)
                goodness = []
                for layer in self.layers:
                    h = layer(h)
                    goodness += [h.pow(2).mean(1)]
                goodness_per_label += [sum(goodness).unsqueeze(1)]
            return torch.cat(goodness_per_label, 1).argmax(1)

        def train_net(self, x_pos, x_neg, epochs):  # type: ignore[no-untyped-def]
            h_pos, h_neg = x_pos, x_neg
            for layer in self.layers:
                h_pos, h_neg = layer.train_layer(h_pos, h_neg, epochs)

    net = Net([dims, 100, 100])
    if spec.freeze:
        freeze_all([net])
    capture = Capture(out_dir, spec)
    capture.start([net])
    x_pos = overlay_y_on_x(x, y)
    x_neg = overlay_y_on_x(x, (y + torch.from_numpy(rng.integers(1, classes, size=len(y)))) % classes)
    try:
        net.train_net(x_pos, x_neg, spec.steps // 2)
        with torch.no_grad():
            capture.extra["train_accuracy"] = float((net.predict(x) == y).float().mean())
    finally:
        out = capture.finish()
    return out


def train_polynomial(out_dir: str, spec: OthersSpec) -> str:
    import torch
    from torch import nn

    torch.manual_seed(spec.seed)
    degree = 4
    W_target = torch.randn(degree, 1) * 5
    b_target = torch.randn(1) * 5

    def make_features(x):  # type: ignore[no-untyped-def]
        """Builds features i.e. a matrix with columns [x, x^2, x^3, x^4]."""
        x = x.unsqueeze(1)
        return torch.cat([x**i for i in range(1, degree + 1)], 1)

    def get_batch(batch_size: int = 32):  # type: ignore[no-untyped-def]
        random = torch.randn(batch_size)
        x = make_features(random)
        return x, x.mm(W_target) + b_target.item()

    fc = nn.Linear(W_target.size(0), 1)
    criterion = nn.SmoothL1Loss()
    if spec.freeze:
        freeze_all([fc])
    capture = Capture(out_dir, spec)
    capture.start([fc], [criterion])
    try:
        for _ in range(spec.steps):
            batch_x, batch_y = get_batch()
            fc.zero_grad()
            output = criterion(fc(batch_x), batch_y)
            loss = output.item()
            output.backward()
            for param in fc.parameters():
                if param.grad is not None:
                    param.data.add_(-spec.lr * param.grad)
            capture.losses.append(loss)
            if loss < 1e-3:  # stop criterion
                break
    finally:
        capture.extra["coefficients"] = [float(v) for v in fc.weight.detach().view(-1)]
        out = capture.finish()
    return out
