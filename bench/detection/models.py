"""Small PyTorch models for the corpus, plus the initialisation faults planted in them."""

from __future__ import annotations

from typing import Any

from bench.detection.tasks import FEATURES, IMAGE, MULTILABELS, SEQUENCE, VOCAB


def _outputs(spec: Any) -> int:
    if spec.task in ("xor", "regression") or spec.loss == "bce":
        return 1
    if spec.task == "multilabel":
        return MULTILABELS
    return spec.classes


def build_model(spec: Any) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(spec.seed)
    outputs = _outputs(spec)
    inputs = 2 if spec.task == "xor" else FEATURES
    name = spec.model
    if name == "linear":
        model: nn.Module = nn.Linear(inputs, outputs)
    elif name in ("mlp", "deep_mlp", "wide_mlp", "mlp_tanh", "mlp_gelu", "mlp_dropout", "deep_sigmoid", "deep_tanh"):
        width = {"wide_mlp": 256, "deep_sigmoid": 32, "deep_tanh": 32}.get(name, spec.width)
        depth = {"deep_mlp": 5, "deep_sigmoid": spec.depth, "deep_tanh": spec.depth}.get(name, 2)
        activation = {
            "mlp_tanh": nn.Tanh,
            "mlp_gelu": nn.GELU,
            "deep_sigmoid": nn.Sigmoid,
            "deep_tanh": nn.Tanh,
        }.get(name, nn.ReLU)
        layers: list[nn.Module] = []
        for index in range(depth):
            layers += [nn.Linear(inputs if index == 0 else width, width), activation()]
            if name == "mlp_dropout":
                layers.append(nn.Dropout(0.3))
        layers.append(nn.Linear(width, outputs))
        if spec.fault == "relu_on_logits":  # a ReLU after the classifier: negative logits are dead
            layers.append(nn.ReLU())
        model = nn.Sequential(*layers)
    elif name == "functional_mlp":
        model = _functional_mlp()(inputs, spec.width, outputs)
    elif name == "cnn":
        model = nn.Sequential(
            nn.Conv2d(IMAGE[0], 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * 3 * 3, 32),
            nn.ReLU(),
            nn.Linear(32, outputs),
        )
    elif name == "cnn_bn":
        model = nn.Sequential(
            nn.Conv2d(IMAGE[0], 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(8 * 6 * 6, outputs),
        )
    elif name in ("lstm", "gru", "rnn", "rnn_relu"):
        model = _recurrent()(name, SEQUENCE[1], 32, outputs)
    elif name == "transformer":
        model = _transformer()(VOCAB, 32, outputs, spec.unused_vocab)
    elif name == "embedding":
        model = _embedding_bag()(VOCAB + spec.unused_vocab, 16, outputs)
    else:
        raise ValueError(f"unknown model {name!r}")
    _plant_init(model, spec)
    return model


def _plant_init(model: Any, spec: Any) -> None:
    import torch
    from torch import nn

    layers = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    with torch.no_grad():
        if spec.init == "zero":
            for module in layers:
                module.weight.zero_()
                module.bias.zero_()
        elif spec.init == "constant":
            for module in layers:
                module.weight.fill_(0.05)
                module.bias.zero_()
        elif spec.init == "huge":  # N(0, 100): every tanh/sigmoid saturates
            for module in layers:
                module.weight.normal_(0.0, 100.0)
                module.bias.normal_(0.0, 100.0)
        elif spec.init == "large_bias":
            for module in layers:
                module.weight.normal_(0.0, 3.0)
                module.bias.normal_(0.0, 50.0)
        elif spec.init == "negative_bias":
            for module in layers[:-1]:
                module.bias.fill_(-20.0)
        elif spec.init == "tiny":  # N(0, 1e-4): signals and gradients shrink layer by layer
            for module in layers:
                module.weight.normal_(0.0, 1e-4)
                module.bias.zero_()
        elif spec.init == "large_recurrent":  # recurrent weights far above 1/sqrt(hidden): gradients explode
            for name, parameter in model.named_parameters():
                if "weight_hh" in name:
                    parameter.normal_(0.0, 3.0)


def _functional_mlp() -> type:
    import torch.nn.functional as F
    from torch import nn

    class FunctionalMLP(nn.Module):
        """An MLP whose activations are functional calls (F.relu), as much user code is written."""

        def __init__(self, inputs: int, width: int, outputs: int) -> None:
            super().__init__()
            self.fc1, self.fc2, self.out = nn.Linear(inputs, width), nn.Linear(width, width), nn.Linear(width, outputs)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.out(F.relu(self.fc2(F.relu(self.fc1(x)))))

    return FunctionalMLP


def _recurrent() -> type:
    from torch import nn

    class Recurrent(nn.Module):
        def __init__(self, kind: str, inputs: int, hidden: int, outputs: int) -> None:
            super().__init__()
            if kind == "rnn_relu":
                self.rnn = nn.RNN(inputs, hidden, batch_first=True, nonlinearity="relu")
            else:
                self.rnn = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[kind](inputs, hidden, batch_first=True)
            self.head = nn.Linear(hidden, outputs)

        def forward(self, x):  # type: ignore[no-untyped-def]
            sequence, _ = self.rnn(x)
            return self.head(sequence[:, -1])

    return Recurrent


def _transformer() -> type:
    import torch
    from torch import nn

    class TinyBert(nn.Module):
        """One BERT-style layer: separate query/key/value projections with biases. Softmax is
        shift-invariant, so the key bias gets an exactly-zero gradient by construction."""

        def __init__(self, vocab: int, dim: int, outputs: int, unused: int) -> None:
            super().__init__()
            self.embedding = nn.Embedding(vocab + unused, dim, padding_idx=0)
            self.position = nn.Parameter(torch.randn(32, dim) * 0.02)
            self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
            self.head = nn.Linear(dim, outputs)

        def forward(self, tokens):  # type: ignore[no-untyped-def]
            h = self.embedding(tokens) + self.position[: tokens.shape[1]]
            q, k, v = self.query(h), self.key(h), self.value(h)
            scores = q @ k.transpose(1, 2) / (h.shape[-1] ** 0.5)
            scores = scores.masked_fill((tokens == 0).unsqueeze(1), -1e4)
            h = self.norm1(h + torch.softmax(scores, dim=-1) @ v)
            h = self.norm2(h + self.ff(h))
            return self.head(h.mean(dim=1))

    return TinyBert


def _embedding_bag() -> type:
    from torch import nn

    class EmbeddingClassifier(nn.Module):
        def __init__(self, vocab: int, dim: int, outputs: int) -> None:
            super().__init__()
            self.embedding = nn.Embedding(vocab, dim, padding_idx=0)
            self.fc = nn.Linear(dim, 32)
            self.relu = nn.ReLU()
            self.out = nn.Linear(32, outputs)

        def forward(self, tokens):  # type: ignore[no-untyped-def]
            mask = (tokens != 0).unsqueeze(-1).float()
            pooled = (self.embedding(tokens) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            return self.out(self.relu(self.fc(pooled)))

    return EmbeddingClassifier
