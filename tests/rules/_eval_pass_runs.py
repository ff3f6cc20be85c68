"""Plain PyTorch training with a validation pass each epoch, evaluated as Hugging Face's
``Trainer`` does (``model.eval()``, ``torch.no_grad()``, a loss per batch, no ``hook.set_mode``):
the hook tells EVAL from TRAIN by itself.

A regression (mean squared error). The validation batches get harder with their position in the
pass: batch ``j``'s targets carry an offset of +-sqrt(j * SPREAD) (alternating signs), which adds
``j * SPREAD`` to its loss whatever the model does, as a validation set sorted by length or source
differs batch by batch. One batch of each pass at a different position (every 10th EVAL step of
8-batch passes: positions 0, 2, 4, 6, ...) then rises steadily, though the mean over each pass
falls. ``overfit=True`` is the overfitting twin: 32 training examples with noisy targets, a wide
model, many epochs: the training loss falls towards 0 while the validation loss turns up.
"""

from __future__ import annotations

import numpy as np
import torch

import trainguard.pytorch as tg
from trainguard.trial import create_trial

EVAL_BATCHES = 8
BATCH = 16
SPREAD = 0.1
LOSS = "MSELoss_output_0"


def _targets(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (x @ weights).unsqueeze(1)


def train(out: str, *, epochs: int, overfit: bool = False, save_interval: int = 10, seed: int = 0,
          eval_batches: int = EVAL_BATCHES):
    """Train, validate every epoch; the run's trial."""
    torch.manual_seed(seed)
    weights = torch.randn(16) / 4
    train_count = 32 if overfit else 2048
    x = torch.randn(train_count, 16)
    y = _targets(x, weights) + (0.5 if overfit else 0.1) * torch.randn(train_count, 1)
    x_val = torch.randn(eval_batches * BATCH, 16)
    signs = torch.tensor([1.0, -1.0]).repeat(eval_batches * BATCH // 2).unsqueeze(1)
    offsets = torch.arange(eval_batches).repeat_interleave(BATCH).unsqueeze(1).float()
    y_val = _targets(x_val, weights) + signs * torch.sqrt(offsets * SPREAD)
    width = 512 if overfit else 32
    model = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    criterion = torch.nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2 if overfit else 3e-3)
    hook = tg.Hook(out, save_config=tg.SaveConfig(save_interval=save_interval))
    hook.register_module(model)
    hook.register_loss(criterion)
    for _ in range(epochs):
        model.train()
        order = torch.randperm(train_count)
        for start in range(0, train_count, BATCH):
            batch = order[start : start + BATCH]
            optimizer.zero_grad()
            criterion(model(x[batch]), y[batch]).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for start in range(0, len(x_val), BATCH):
                criterion(model(x_val[start : start + BATCH]), y_val[start : start + BATCH])
    hook.close()
    return create_trial(out)


def pass_means(trial) -> list[float]:
    """The mean EVAL loss over each run of consecutive saved EVAL steps."""
    means, current, last = [], [], None
    for step in [step for step in trial.steps() if trial.mode(step) == tg.modes.EVAL]:
        if last is not None and step != last + 1:
            means.append(float(np.mean(current)))
            current = []
        current.append(float(trial.tensor(LOSS).value(step)))
        last = step
    if current:
        means.append(float(np.mean(current)))
    return means
