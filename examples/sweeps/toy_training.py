"""The small training both sweep examples tune (and the integration tests run): plain PyTorch.

An MLP with tanh activations regresses a noisy linear target with SGD. The knobs a sweep varies
are the learning rate and the initial weight scale; two settings are bugs trainguard must catch:

* ``lr`` far too high (e.g. 1.0): the loss overflows and the weights turn NaN in a few steps;
* ``init_scale`` far too large (e.g. 20): every tanh unit starts saturated (|input| >> 3), its
  gradient is ~0 and the network barely learns.

``train`` captures the run with ``trainguard.pytorch.Hook`` into ``out_dir`` and calls
``on_epoch(epoch, steps, last_saved_step, loss)`` after every epoch (``steps`` trained so far, the
last step the hook saved and has written); when it returns True training stops early.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn

import trainguard.pytorch as tg
from trainguard.integrations.live import default_hook_collections

STEPS_PER_EPOCH = 8
# The sweep both examples run: two sane learning rates and the two bugs.
CONFIGS = (
    {"name": "good-lr-0.01", "lr": 0.01, "init_scale": 1.0},
    {"name": "good-lr-0.003", "lr": 0.003, "init_scale": 1.0},
    {"name": "lr-far-too-high", "lr": 1.0, "init_scale": 1.0},
    {"name": "saturated-init", "lr": 0.01, "init_scale": 1000.0},  # weights 1000x PyTorch's default
)


def build_model(init_scale: float, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    with torch.no_grad():
        for layer in model:
            if isinstance(layer, nn.Linear):
                layer.weight.mul_(init_scale)
    return model


def train(
    config: dict,
    out_dir: str,
    on_epoch: Callable[[int, int, int, float], bool],
    *,
    epochs: int = 12,
    save_interval: int = 2,
) -> int:
    """Train ``epochs`` epochs (fewer if ``on_epoch`` says stop); the number of steps trained."""
    lr, init_scale = float(config["lr"]), float(config.get("init_scale", 1.0))
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(STEPS_PER_EPOCH * 32, 16, generator=generator)
    target = inputs @ torch.randn(16, 1, generator=generator) + 0.1 * torch.randn(len(inputs), 1, generator=generator)
    model = build_model(init_scale)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    criterion = nn.MSELoss()
    hook = tg.Hook(
        out_dir, save_config=tg.SaveConfig(save_interval=save_interval), include_collections=default_hook_collections()
    )
    hook.register_module(model)
    hook.register_loss(criterion)
    step = 0
    try:
        for epoch in range(epochs):
            for start in range(0, len(inputs), 32):
                optimizer.zero_grad()
                loss = criterion(model(inputs[start : start + 32]), target[start : start + 32])
                loss.backward()
                optimizer.step()
                step += 1
            value = loss.item()
            # The last saved step already written: global steps count from 0, and the PyTorch
            # hook writes a step when the next one begins, so the epoch's last step (step - 1)
            # is not on disk yet; waiting for it would wait for the timeout.
            last_saved = max(0, step - 2) // save_interval * save_interval
            if on_epoch(epoch, step, last_saved, value if math.isfinite(value) else float("nan")):
                break
    finally:
        hook.close()
    return step
