"""A real run for the report tests: a tiny PyTorch model trained with trainguard's hook."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

import trainguard.pytorch as tg


class Net(nn.Module):
    """Tensor names ``Net_fc1.weight``, ``gradient/Net_fc1.weight``, ``relu1_output_0``..."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 16)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(16, 8)
        self.relu2 = nn.ReLU()
        self.fc3 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.relu2(self.fc2(self.relu1(self.fc1(x)))))


def train_run(
    out_dir: Path,
    *,
    epochs: int = 3,
    train_batches: int = 10,
    eval_batches: int = 4,
    save_interval: int = 2,
    reductions_only: bool = False,
) -> Path:
    """Train for ``epochs`` × (``train_batches`` TRAIN + ``eval_batches`` EVAL) steps.

    Saves weights, biases, gradients, losses and ReLU outputs every ``save_interval`` steps and
    an ``accuracy`` scalar at every EVAL step; with ``reductions_only`` the hook saves only the
    l2 norm and zero fraction of each tensor instead of raw values (losses stay raw).
    """
    torch.manual_seed(0)
    model = Net()
    with torch.no_grad():
        model.fc2.bias.fill_(-0.3)  # makes part of relu2 dead, so zero fractions are not all 0
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    collections = ["weights", "biases", "gradients", "losses", "relu_output"]
    kwargs = {}
    if reductions_only:
        kwargs["reduction_config"] = tg.ReductionConfig(reductions=["zero_fraction"], norms=["l2"])
    hook = tg.Hook(
        str(out_dir), save_config=tg.SaveConfig(save_interval=save_interval), include_collections=collections, **kwargs
    )
    if reductions_only:
        hook.get_collection("losses").reduction_config = tg.ReductionConfig(save_raw_tensor=True)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    generator = torch.Generator().manual_seed(1)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(32, 4, generator=generator)
        return x, (x[:, 0] > 0).long() + (x[:, 1] > 1).long()

    try:
        for _ in range(epochs):
            hook.set_mode(tg.modes.TRAIN)
            model.train()
            for _ in range(train_batches):
                x, y = batch()
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
            hook.set_mode(tg.modes.EVAL)
            model.eval()
            with torch.no_grad():
                for _ in range(eval_batches):
                    x, y = batch()
                    logits = model(x)
                    loss_fn(logits, y)
                    hook.save_scalar("accuracy", float((logits.argmax(1) == y).float().mean()))
    finally:
        hook.close()
    return out_dir
