"""What the "others" cases share: their spec, the hook wired in as a user wires it, and the
metrics file the scorer checks each label against.

The others_* modules hold programs of the kinds found in public example collections (a DCGAN,
a VAE, word-level language models feeding their hidden state back, LBFGS with a closure, RL on
an inline environment, a graph convolution with bare parameters, a forward-forward net, ...),
each written anew in the idioms those collections use (their own loops, optimizers and
initialisations), not through :func:`bench.detection.harness.train`. Each family has a healthy
run and two fault twins: the learning rate multiplied by 1e4 and the learning rate 0 (or every
parameter frozen).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.detection.harness import COLLECTIONS, METRICS_FILE


@dataclass(frozen=True)
class OthersSpec:
    program: str  # which program of the others_* modules trains
    variant: str = ""  # a program's own switch (the RNN kind of a word LM, the pixel scaling, ...)
    lr: float = 0.01
    steps: int = 60
    seed: int = 0
    save_interval: int = 1
    freeze: bool = False  # every parameter requires_grad False (a frozen twin)
    epochs: int = 0  # programs that count epochs rather than steps


@dataclass
class Capture:
    """The hook of one run and what its metrics file will say.

    ``watch`` registers modules and loss modules with the hook as the README shows; the
    parameters' values at the start are kept so that the metrics can say which never changed.
    """

    out_dir: str
    spec: OthersSpec
    hook: Any = None
    modules: list[Any] = field(default_factory=list)
    before: dict[str, Any] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    val_losses: list[tuple[int, float]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def start(self, modules: Iterable[Any], losses: Iterable[Any] = (), tg: Any = None) -> Any:
        import torch

        import trainguard.pytorch as trainguard_pytorch

        tg = tg or trainguard_pytorch
        self.hook = tg.Hook(
            os.fspath(self.out_dir),
            save_config=tg.SaveConfig(save_interval=self.spec.save_interval),
            include_collections=list(COLLECTIONS),
        )
        for module in modules:
            self.modules.append(module)
            self.hook.register_module(module)
        for loss in losses:
            self.hook.register_loss(loss)
        self.before = {name: p.detach().clone() for name, p in self._parameters()}
        torch.set_num_threads(1)
        return self.hook

    def _parameters(self) -> list[tuple[str, Any]]:
        seen: set[int] = set()
        named = []
        for index, module in enumerate(self.modules):
            for name, parameter in module.named_parameters():
                if id(parameter) not in seen:
                    seen.add(id(parameter))
                    named.append((f"{index}.{name}", parameter))
        return named

    def finish(self) -> str:
        import torch

        if self.hook is not None:
            self.hook.close()
        unchanged = [name for name, p in self._parameters() if torch.equal(self.before[name], p.detach())]
        metrics = {
            "spec": asdict(self.spec),
            "losses": self.losses,
            "val_losses": self.val_losses,
            "nonfinite": any(not math.isfinite(value) for value in self.losses),
            "unchanged_parameters": unchanged,
            "parameters": len(self.before),
            **self.extra,
        }
        with open(os.path.join(self.out_dir, METRICS_FILE), "w", encoding="utf-8") as file:
            json.dump(metrics, file)
        return os.fspath(self.out_dir)


def freeze_all(modules: Iterable[Any]) -> None:
    for module in modules:
        for parameter in module.parameters():
            parameter.requires_grad_(False)


def markov_text(vocab: int, length: int, seed: int = 3) -> Any:
    """A token stream from a small Markov source: each word has a handful of likely successors
    (Zipf-weighted), so next-word prediction can fall well below log(vocab) but never to 0."""
    import numpy as np

    rng = np.random.default_rng(seed)
    successors = rng.integers(0, vocab, size=(vocab, 4))
    weights = np.array([0.55, 0.25, 0.12, 0.08])
    stream = np.empty(length, dtype=np.int64)
    stream[0] = 0
    choices = rng.choice(4, size=length, p=weights)
    noise = rng.random(length) < 0.05  # an occasional unpredictable word
    random_words = rng.integers(0, vocab, size=length)
    for index in range(1, length):
        previous = stream[index - 1]
        stream[index] = random_words[index] if noise[index] else successors[previous, choices[index]]
    return stream
