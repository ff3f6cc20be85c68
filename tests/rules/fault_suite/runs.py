"""Small real PyTorch training runs, healthy or with one planted fault, captured by trainguard's hook.

Every run is a few hundred milliseconds on one CPU thread: tiny MLP/CNN/embedding models on
synthetic but learnable data (the class is a fixed random linear function of the input), a
few dozen steps, every collection the rules read. :data:`CASES` lists them; a case's
``expected`` names the rules its fault must fire (healthy cases expect none).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

COLLECTIONS = [
    "weights",
    "biases",
    "gradients",
    "losses",
    "inputs",
    "relu_input",
    "relu_output",
    "tanh_input",
    "sigmoid_input",
    "labels",
    "predictions",
]


@dataclass(frozen=True)
class Config:
    """What to train and which fault to plant."""

    model: str = "mlp"  # mlp | deep_mlp | cnn | deep_sigmoid | deep_tanh | embedding | wide_mlp
    optimizer: str = "sgd"  # sgd | sgd_momentum | adam
    lr: float | None = None  # None: 0.1 for SGD, 0.001 for Adam
    steps: int = 60
    batch: int = 32
    seed: int = 0
    save_interval: int = 1
    validation: bool = False  # EVAL phases of 2 batches every `eval_every` TRAIN steps
    fixed_validation: bool = False  # the same 2 EVAL batches every phase (a held-out set), not fresh ones
    eval_every: int = 10
    init: str = "default"  # default | zero | constant | huge | large_bias | negative_bias
    inputs: str = "normalized"  # normalized | offset_scaled | unit_images | raw_images | padded_tokens | tokens
    labels: str = "teacher"  # teacher | shuffled | imbalanced
    freeze: bool = False  # freeze the first layer
    depth: int = 7  # activation layers of the deep_sigmoid / deep_tanh stacks
    train_size: int | None = None  # a fixed small training set, cycled (overfitting)
    classes: int = 4
    binary: bool = False  # 2 classes, one output logit, BCEWithLogitsLoss


@dataclass(frozen=True)
class Case:
    name: str
    config: Config
    expected: tuple[str, ...] = ()
    description: str = ""
    kind: str = field(default="fault")

    @property
    def healthy(self) -> bool:
        return self.kind == "healthy"


# -- data ---------------------------------------------------------------------------------------


class Data:
    """A learnable synthetic task: each class has a prototype; an example is its class's
    prototype plus unit noise (features or 1×12×12 images), or tokens drawn from its class's
    token distribution. Fault variants change the labels or the input scale."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.rng = np.random.default_rng(1000 + config.seed)
        task_rng = np.random.default_rng(7)  # the same task for every seed
        self.features = 20
        self.image = (1, 12, 12)
        self.vocab, self.length = 50, 16
        shape = self.image if config.model == "cnn" else (self.features,)
        self.prototypes = task_rng.normal(scale=0.8, size=(config.classes, *shape))
        self.prototypes -= self.prototypes.mean(axis=0)
        # what a standardiser fitted on the data would subtract: the label-weighted prototype
        weights = np.array([0.95, 0.05] + [0.0] * (config.classes - 2)) if config.labels == "imbalanced" else None
        self.center = np.average(self.prototypes, axis=0, weights=weights)
        preferences = task_rng.random((config.classes, self.vocab - 1)) ** 3
        self.token_probabilities = preferences / preferences.sum(axis=1, keepdims=True)
        self.fixed: tuple[np.ndarray, np.ndarray] | None = None
        if config.train_size:
            self.fixed = self._batch(config.train_size, train=True)
            self.cursor = 0

    def _batch(self, size: int, train: bool) -> tuple[np.ndarray, np.ndarray]:
        config = self.config
        if config.labels == "imbalanced":
            labels = np.where(self.rng.random(size) < 0.95, 0, 1)
        else:
            labels = self.rng.integers(0, config.classes, size=size)
        if config.model == "embedding":
            tokens = np.stack(
                [
                    1 + self.rng.choice(self.vocab - 1, size=self.length, p=self.token_probabilities[label])
                    for label in labels
                ]
            )
            if config.inputs == "padded_tokens":
                lengths = self.rng.integers(2, 5, size=size)  # ~80 % of every sequence is padding 0
                tokens[np.arange(self.length)[None, :] >= lengths[:, None]] = 0
            x = tokens.astype(np.int64)
        else:
            x = self.prototypes[labels] - self.center + self.rng.normal(size=(size, *self.prototypes.shape[1:]))
            if config.inputs == "offset_scaled":
                x = x * 100.0 + 50.0
            elif config.inputs == "unit_images":  # ToTensor() only: values in [0, 1], mean ~0.5
                x = 1.0 / (1.0 + np.exp(-x))
            elif config.inputs == "raw_images":  # uint8 pixel values as floats
                x = 255.0 / (1.0 + np.exp(-x))
            x = x.astype(np.float32)
        if config.labels == "shuffled" and train:  # labels unrelated to the inputs
            labels = self.rng.integers(0, config.classes, size=size)
        return x, labels

    def train_batch(self) -> tuple[np.ndarray, np.ndarray]:
        if self.fixed is None:
            return self._batch(self.config.batch, train=True)
        x, y = self.fixed
        index = (np.arange(self.config.batch) + self.cursor) % len(y)
        self.cursor = (self.cursor + self.config.batch) % len(y)
        return x[index], y[index]

    def eval_batch(self) -> tuple[np.ndarray, np.ndarray]:
        return self._batch(self.config.batch, train=False)


# -- models -------------------------------------------------------------------------------------


def build_model(config: Config, data: Data) -> Any:
    import torch
    from torch import nn

    classes = 1 if config.binary else config.classes
    if config.model == "deep_mlp":
        hidden: list[nn.Module] = []
        for index in range(5):
            hidden += [nn.Linear(data.features if index == 0 else 64, 64), nn.ReLU()]
        model = nn.Sequential(*hidden, nn.Linear(64, classes))
    elif config.model == "mlp":
        model = nn.Sequential(
            nn.Linear(data.features, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, classes)
        )
    elif config.model == "wide_mlp":
        model = nn.Sequential(
            nn.Linear(data.features, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, classes)
        )
    elif config.model == "cnn":
        model = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * 3 * 3, 32),
            nn.ReLU(),
            nn.Linear(32, classes),
        )
    elif config.model in ("deep_sigmoid", "deep_tanh"):
        activation = nn.Sigmoid if config.model == "deep_sigmoid" else nn.Tanh
        layers: list[nn.Module] = [nn.Linear(data.features, 32), activation()]
        for _ in range(config.depth - 1):
            layers += [nn.Linear(32, 32), activation()]
        model = nn.Sequential(*layers, nn.Linear(32, classes))
    elif config.model == "embedding":
        model = _EmbeddingClassifier(data.vocab, 16, classes)
    else:
        raise ValueError(f"unknown model {config.model!r}")
    with torch.no_grad():
        linears = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        if config.init == "zero":
            for module in linears:
                module.weight.zero_()
                module.bias.zero_()
        elif config.init == "constant":
            for module in linears:
                module.weight.fill_(0.05)
                module.bias.fill_(0.0)
        elif config.init == "huge":  # weights and biases N(0, 100): every layer saturates
            for module in linears:
                module.weight.normal_(0.0, 100.0)
                module.bias.normal_(0.0, 100.0)
        elif config.init == "large_bias":  # weights N(0, 3), biases N(0, 50): pre-activations far out
            for module in linears:
                module.weight.normal_(0.0, 3.0)
                module.bias.normal_(0.0, 50.0)
        elif config.init == "negative_bias":
            for module in linears[:-1]:
                module.bias.fill_(-20.0)
    if config.freeze:
        for parameter in linears_of(model)[0].parameters():
            parameter.requires_grad_(False)
    return model


def linears_of(model: Any) -> list[Any]:
    from torch import nn

    return [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d, nn.Embedding))]


def _embedding_classifier_class() -> type:
    from torch import nn

    class EmbeddingClassifier(nn.Module):
        def __init__(self, vocab: int, dim: int, classes: int) -> None:
            super().__init__()
            self.embedding = nn.Embedding(vocab, dim, padding_idx=0)
            self.fc = nn.Linear(dim, 32)
            self.relu = nn.ReLU()
            self.out = nn.Linear(32, classes)

        def forward(self, tokens):  # type: ignore[no-untyped-def]
            mask = (tokens != 0).unsqueeze(-1).float()
            pooled = (self.embedding(tokens) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            return self.out(self.relu(self.fc(pooled)))

    return EmbeddingClassifier


def _EmbeddingClassifier(vocab: int, dim: int, classes: int) -> Any:  # noqa: N802 - a class factory
    return _embedding_classifier_class()(vocab, dim, classes)


# -- training -----------------------------------------------------------------------------------


def train(out_dir: str, config: Config) -> str:
    """Train ``config`` with trainguard's PyTorch hook writing to ``out_dir``; returns ``out_dir``."""
    import torch
    from torch import nn

    import trainguard.pytorch as tg

    torch.set_num_threads(1)
    torch.manual_seed(config.seed)
    data = Data(config)
    model = build_model(config, data)
    loss_fn = nn.BCEWithLogitsLoss() if config.binary else nn.CrossEntropyLoss()
    parameters = [p for p in model.parameters() if p.requires_grad]
    lr = config.lr if config.lr is not None else (0.001 if config.optimizer == "adam" else 0.1)
    if config.optimizer == "adam":
        optimizer = torch.optim.Adam(parameters, lr=lr)
    else:
        optimizer = torch.optim.SGD(parameters, lr=lr, momentum=0.9 if config.optimizer == "sgd_momentum" else 0.0)
    hook = tg.Hook(
        os.fspath(out_dir),
        save_config=tg.SaveConfig(save_interval=config.save_interval),
        include_collections=list(COLLECTIONS),
    )
    hook.register_module(model)
    hook.register_loss(loss_fn)
    as_input = (
        (lambda a: torch.from_numpy(a)) if config.model == "embedding" else (lambda a: torch.from_numpy(a).float())
    )
    held_out: list[Any] = []
    try:
        for step in range(config.steps):
            hook.set_mode(tg.modes.TRAIN)
            model.train()
            x, y = data.train_batch()
            optimizer.zero_grad()
            loss = loss_fn(*_outputs_and_targets(model(as_input(x)), y, config))
            loss.backward()
            optimizer.step()
            if config.validation and (step + 1) % config.eval_every == 0:
                hook.set_mode(tg.modes.EVAL)
                model.eval()
                with torch.no_grad():
                    if not config.fixed_validation or not held_out:
                        held_out = [data.eval_batch() for _ in range(2)]
                    for vx, vy in held_out:
                        loss_fn(*_outputs_and_targets(model(as_input(vx)), vy, config))
    finally:
        hook.close()
    return os.fspath(out_dir)


def _outputs_and_targets(output: Any, labels: np.ndarray, config: Config) -> tuple[Any, Any]:
    import torch

    if config.binary:
        return output.squeeze(1), torch.from_numpy(labels).float()
    return output, torch.from_numpy(labels).long()


# -- the cases ----------------------------------------------------------------------------------


def _healthy() -> list[Case]:
    cases = []
    for model in ("mlp", "cnn"):
        for optimizer in ("sgd", "adam"):
            for seed in (0, 1):
                validation = (seed == 0) == (optimizer == "sgd")  # each model/optimizer with and without
                name = f"healthy-{model}-{optimizer}-{'val' if validation else 'noval'}-s{seed}"
                cases.append(
                    Case(
                        name,
                        Config(
                            model=model,
                            optimizer=optimizer,
                            seed=seed,
                            validation=validation,
                            save_interval=1 if seed == 0 else 2,
                        ),
                        kind="healthy",
                        description=f"{model.upper()}, default init, {optimizer}",
                    )
                )
    cases.append(
        Case(
            # Was a planted fault ("frozen-first-layer" expecting UnchangedTensor/WeightUpdateRatio):
            # a frozen layer is how fine-tuning works, its weights unchanged by construction, so the
            # calibrated rules stay silent on it (semantics=sagemaker still flags it).
            "healthy-frozen-first-layer-s2",
            Config(freeze=True, seed=2),
            kind="healthy",
            description="first layer requires_grad=False (fine-tuning the rest)",
        )
    )
    cases.append(
        Case(
            "healthy-deep-mlp-sgdm-s0",
            Config(model="deep_mlp", optimizer="sgd_momentum", lr=0.1, batch=64),
            kind="healthy",
            description="5 hidden ReLU layers, default init, SGD momentum 0.9",
        )
    )
    cases.append(
        Case(
            "healthy-deep-mlp-adam-val-s1",
            Config(model="deep_mlp", optimizer="adam", seed=1, validation=True, save_interval=2),
            kind="healthy",
            description="5 hidden ReLU layers, default init, adam",
        )
    )
    cases.append(
        Case(
            "healthy-binary-mlp-adam-val-s0",
            Config(binary=True, classes=2, optimizer="adam", validation=True),
            kind="healthy",
            description="binary MLP, one output logit, BCEWithLogitsLoss, adam",
        )
    )
    cases.append(
        Case(
            "healthy-embedding-adam-s0",
            Config(model="embedding", optimizer="adam", lr=0.01, inputs="tokens"),
            kind="healthy",
            description="embedding bag, unpadded tokens",
        )
    )
    return cases


def _faults() -> list[Case]:
    C = Case
    return [
        # learning rate far too high: NaN with SGD; with Adam the weights jump but stay finite
        C("lr-high-mlp-sgd", Config(lr=200.0), ("ExplodingTensor", "WeightUpdateRatio"), "SGD lr=200"),
        C(
            "lr-high-mlp-sgd-s1",
            Config(lr=1000.0, seed=1, save_interval=2),
            ("ExplodingTensor", "WeightUpdateRatio"),
            "SGD lr=1000, saved every 2 steps",
        ),
        C(
            "lr-high-cnn-sgd",
            Config(model="cnn", lr=1e4, seed=1),
            ("ExplodingTensor", "WeightUpdateRatio"),
            "CNN SGD lr=1e4",
        ),
        C("lr-high-mlp-adam", Config(optimizer="adam", lr=10.0, seed=2), ("WeightUpdateRatio",), "Adam lr=10"),
        C(
            "lr-high-cnn-adam",
            Config(model="cnn", optimizer="adam", lr=10.0, seed=0, save_interval=3),
            ("WeightUpdateRatio",),
            "CNN Adam lr=10, saved every 3 steps",
        ),
        # learning rate 0 / frozen parameters
        C("lr-zero-mlp", Config(lr=0.0), ("UnchangedTensor", "WeightUpdateRatio"), "SGD lr=0"),
        C(
            "lr-zero-cnn-adam",
            Config(model="cnn", optimizer="adam", lr=0.0, seed=1, save_interval=2),
            ("UnchangedTensor", "WeightUpdateRatio"),
            "Adam lr=0",
        ),
        # deep sigmoid/tanh stacks
        C(
            "deep-sigmoid-10",
            Config(model="deep_sigmoid", depth=10),
            ("VanishingGradient",),
            "10 sigmoid layers, default init",
        ),
        C(
            "deep-sigmoid-10-s1",
            Config(model="deep_sigmoid", depth=10, seed=1, save_interval=3),
            ("VanishingGradient",),
            "10 sigmoid layers, default init",
        ),
        C(
            "deep-tanh-huge-init",
            Config(model="deep_tanh", init="huge"),
            ("SaturatedActivation", "VanishingGradient"),
            "7 tanh layers, weights and biases N(0,100)",
        ),
        C(
            "deep-tanh-huge-init-s2",
            Config(model="deep_tanh", init="huge", seed=2, save_interval=2),
            ("SaturatedActivation", "VanishingGradient"),
            "7 tanh layers, weights and biases N(0,100)",
        ),
        C(
            "deep-sigmoid-large-bias",
            Config(model="deep_sigmoid", init="large_bias", seed=1),
            ("SaturatedActivation",),
            "7 sigmoid layers, biases N(0,50)",
        ),
        C(
            "deep-tanh-large-bias",
            Config(model="deep_tanh", init="large_bias", seed=2),
            ("SaturatedActivation",),
            "7 tanh layers, biases N(0,50)",
        ),
        # dead ReLUs
        C("negative-bias-relu-mlp", Config(init="negative_bias"), ("DeadRelu",), "ReLU biases -20"),
        C(
            "negative-bias-relu-cnn",
            Config(model="cnn", init="negative_bias", seed=1, save_interval=2),
            ("DeadRelu",),
            "CNN ReLU biases -20",
        ),
        # constant / zero init
        C("zero-init-mlp", Config(init="zero"), ("PoorWeightInitialization", "AllZero"), "all weights and biases 0"),
        C(
            "zero-init-cnn",
            Config(model="cnn", init="zero", seed=1),
            ("PoorWeightInitialization", "AllZero"),
            "CNN all weights and biases 0",
        ),
        C("constant-init-mlp", Config(init="constant", seed=2), ("PoorWeightInitialization",), "all weights 0.05"),
        # unnormalised inputs
        C("unnormalized-mlp", Config(inputs="offset_scaled"), ("NotNormalizedData",), "features x*100+50"),
        C(
            "unit-images-cnn",
            Config(model="cnn", inputs="unit_images", seed=1),
            ("CheckInputImages",),
            "images in [0,1] (ToTensor only)",
        ),
        C(
            "raw-images-cnn",
            Config(model="cnn", inputs="raw_images", seed=2),
            ("CheckInputImages", "NotNormalizedData"),
            "pixel values 0..255",
        ),
        # padded token sequences
        C(
            "padded-tokens",
            Config(model="embedding", optimizer="adam", lr=0.01, inputs="padded_tokens"),
            ("NLPSequenceRatio",),
            "~80% padding",
        ),
        C(
            "padded-tokens-s1",
            Config(model="embedding", optimizer="adam", lr=0.01, inputs="padded_tokens", seed=1, save_interval=3),
            ("NLPSequenceRatio",),
            "~80% padding",
        ),
    ]


def _loss_faults() -> list[Case]:
    """Faults for the loss/accuracy rules (written by another helper; included once committed)."""
    C = Case
    return [
        C("class-imbalance-95-5", Config(labels="imbalanced", steps=40), ("ClassImbalance",), "95/5 labels"),
        C(
            "class-imbalance-95-5-cnn",
            Config(model="cnn", labels="imbalanced", seed=1, steps=40),
            ("ClassImbalance",),
            "95/5 labels",
        ),
        C(
            "shuffled-labels",
            Config(labels="shuffled", steps=140, save_interval=2),
            ("LossNotDecreasing", "Confusion"),
            "random training labels",
        ),
        C(
            "shuffled-labels-adam-val",
            Config(
                labels="shuffled", steps=140, seed=1, optimizer="adam", validation=True, eval_every=5, save_interval=2
            ),
            ("LossNotDecreasing", "Confusion"),
            "random training labels, Adam, validation every 5 steps",
        ),
        C(
            "overfit-tiny-train",
            Config(
                model="wide_mlp", optimizer="adam", train_size=16, validation=True, steps=100, eval_every=5, lr=0.01
            ),
            ("Overfit", "Overtraining"),
            "16 training samples, wide MLP",
        ),
        C(
            "overfit-tiny-train-s1",
            Config(
                model="wide_mlp",
                optimizer="adam",
                train_size=16,
                validation=True,
                steps=100,
                eval_every=5,
                lr=0.01,
                seed=1,
                fixed_validation=True,
            ),
            ("Overfit", "Overtraining"),
            "16 training samples, a fixed validation set",
        ),
    ]


CASES: list[Case] = _healthy() + _faults() + _loss_faults()
CASES_BY_NAME: dict[str, Case] = {case.name: case for case in CASES}
Builder = Callable[[str, Config], str]
