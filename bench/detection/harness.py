"""One training loop for every PyTorch case of the corpus, captured by trainguard's hook.

A :class:`Spec` says what to train and which fault (if any) to plant; :func:`train` runs it on one
CPU thread into ``out_dir`` and writes ``corpus-metrics.json`` next to the hook's files: the
per-step training losses, validation losses, whether anything went non-finite and which
parameters never changed. The scorer checks each label against these (a planted fault whose
symptom does not show is not a fault; a "healthy" run that does not learn is not healthy).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from typing import Any

from bench.detection.models import build_model
from bench.detection.tasks import Task

# What the built-in rules read (the fault suite's list): saved for every case.
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
METRICS_FILE = "corpus-metrics.json"


@dataclass(frozen=True)
class Spec:
    task: str = "features"  # features | images | tokens | sequences | xor | regression | multilabel
    model: str = "mlp"
    loss: str = "ce"  # ce | bce (binary, one logit) | mse | bce_multi
    optimizer: str = "sgd"  # sgd | sgd_momentum | adam | adamw | rmsprop
    lr: float = 0.1
    weight_decay: float = 0.0
    steps: int = 80
    batch: int = 32
    seed: int = 0
    save_interval: int = 1
    classes: int = 4
    separation: float = 0.8  # class prototype scale (noise is `noise`)
    noise: float = 1.0
    label_noise: float = 0.0  # fraction of training labels replaced at random (noisy mini-batches)
    width: int = 64
    depth: int = 7
    validation: bool = False
    eval_every: int = 10
    schedule: str = "none"  # none | warmup_cosine | step | onecycle
    accumulation: int = 1
    bf16: bool = False
    compile: bool = False
    freeze: str = "none"  # none | first (first layer requires_grad False, a frozen backbone)
    pretrain_steps: int = 0  # fine-tuning: train this long without the hook first, then go on at `lr`
    train_size: int = 0  # a fixed small training set, cycled (converged or overfitting runs)
    unused_vocab: int = 0  # embedding rows no token ever uses
    zero_rows: float = 0.0  # fraction of input rows that are all zero
    clip: float = 0.0  # clip_grad_norm_ max_norm (0: none)
    init: str = "default"
    data_fault: str = "none"  # see tasks.Task
    fault: str = "none"  # loop/model faults, see below
    onset: int = 0  # the step a mid-run fault starts


def _loss_fn(spec: Spec) -> Any:
    from torch import nn

    if spec.loss == "mse" or spec.task == "regression":
        return nn.MSELoss()
    if spec.loss in ("bce", "bce_multi") or spec.task in ("xor", "multilabel"):
        return nn.BCEWithLogitsLoss()
    return nn.CrossEntropyLoss()


def _targets(output: Any, y: Any, spec: Spec) -> tuple[Any, Any]:
    import torch

    if spec.task in ("xor",) or spec.loss == "bce":
        return output.squeeze(1), torch.from_numpy(y).float()
    if spec.task in ("regression", "multilabel"):
        return output, torch.from_numpy(y).float()
    if spec.loss == "mse":  # wrong loss for the task: class index regressed from one output column
        return output[:, 0], torch.from_numpy(y).float()
    return output, torch.from_numpy(y).long()


def _optimizer(spec: Spec, parameters: list[Any]) -> Any:
    import torch

    if spec.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=spec.lr, weight_decay=spec.weight_decay)
    if spec.optimizer == "adamw":
        return torch.optim.AdamW(parameters, lr=spec.lr, weight_decay=spec.weight_decay or 0.01)
    if spec.optimizer == "rmsprop":
        return torch.optim.RMSprop(parameters, lr=spec.lr)
    momentum = {"sgd_momentum": 0.9, "sgd_momentum_high": 0.99}.get(spec.optimizer, 0.0)
    return torch.optim.SGD(parameters, lr=spec.lr, momentum=momentum, weight_decay=spec.weight_decay)


def _scheduler(spec: Spec, optimizer: Any) -> Any:
    import torch

    if spec.schedule == "warmup_cosine":
        warmup = max(1, spec.steps // 10)

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, spec.steps - warmup)))

        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    if spec.schedule == "step":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, spec.steps // 3), gamma=0.3)
    if spec.schedule == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=spec.lr, total_steps=spec.steps)
    return None


def _as_input(x: Any, spec: Spec) -> Any:
    import torch

    tensor = torch.from_numpy(x)
    return tensor if spec.task == "tokens" else tensor.float()


def _first_layer(model: Any) -> Any:
    from torch import nn

    kinds = (nn.Linear, nn.Conv2d, nn.Embedding, nn.LSTM, nn.GRU, nn.RNN)
    return next(m for m in model.modules() if isinstance(m, kinds))


def _pretrain(model: Any, task: Task, spec: Spec) -> None:
    """The 'pre-trained' starting point of a fine-tuning case: Adam, no hook."""
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = _loss_fn(spec)
    for _ in range(spec.pretrain_steps):
        x, y = task.train_batch()
        optimizer.zero_grad()
        loss_fn(*_targets(model(_as_input(x, spec)), y, spec)).backward()
        optimizer.step()


def train(out_dir: str, spec: Spec) -> str:
    """Train ``spec`` with the hook writing to ``out_dir``; returns ``out_dir``."""
    import torch

    import trainguard.pytorch as tg

    torch.set_num_threads(1)
    torch.manual_seed(spec.seed)
    task = Task(spec)
    model = build_model(spec)
    if spec.pretrain_steps:
        _pretrain(model, task, spec)
    if spec.freeze == "first":
        for parameter in _first_layer(model).parameters():
            parameter.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if spec.fault == "optimizer_misses_layers":  # optimizer built from the head only (a refactor lost the rest)
        trainable = list(list(model.children())[-1].parameters())
    optimizer = _optimizer(spec, trainable)
    scheduler = _scheduler(spec, optimizer)
    loss_fn = _loss_fn(spec)
    hook = tg.Hook(
        os.fspath(out_dir),
        save_config=tg.SaveConfig(save_interval=spec.save_interval),
        include_collections=list(COLLECTIONS),
    )
    hook.register_module(model)
    hook.register_loss(loss_fn)
    forward = torch.compile(model) if spec.compile else model
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    losses: list[float] = []
    accuracies: list[float] = []  # last micro-batch's training accuracy, single-label classification only
    val_losses: list[tuple[int, float]] = []
    try:
        for step in range(spec.steps):
            task.step = step
            hook.set_mode(tg.modes.TRAIN)
            model.train()
            if spec.fault == "lr_spike" and step == spec.onset:  # a schedule bug: lr x1000 mid-run
                for group in optimizer.param_groups:
                    group["lr"] *= 1000.0
            if spec.fault not in ("no_zero_grad",):
                optimizer.zero_grad()
            total = 0.0
            for _ in range(spec.accumulation):
                x, y = task.train_batch()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec.bf16):
                    output = forward(_as_input(x, spec))
                    if spec.fault == "softmax_before_ce":  # CrossEntropyLoss applies log-softmax itself
                        output = torch.softmax(output, dim=-1)
                    elif spec.fault == "log_of_softmax_underflow":
                        output = output * 1e3  # logits blown up: softmax underflows to exactly 0
                    loss = loss_fn(*_targets(output.float(), y, spec))
                    if spec.fault == "manual_log_zero":  # log(softmax) by hand: -inf once a probability is 0
                        probabilities = torch.softmax(output.float() * 200.0, dim=-1)
                        loss = -torch.log(probabilities[torch.arange(len(y)), torch.from_numpy(y).long()]).mean()
                    if spec.fault == "loss_sign_flipped":  # maximises the loss (e.g. a negated metric)
                        loss = -loss
                if spec.task in ("features", "images", "tokens", "sequences") and spec.loss in ("ce", "mse"):
                    predicted = output.detach().float().argmax(dim=-1).numpy()
                    accuracies.append(float((predicted == y).mean()))
                (loss / spec.accumulation).backward()
                total += float(loss.detach()) / spec.accumulation
            if spec.fault == "zero_grad_after_backward":  # zero_grad moved between backward and step
                optimizer.zero_grad()
            if spec.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), spec.clip)
            if spec.fault != "no_optimizer_step":
                optimizer.step()
            if scheduler is not None:
                scheduler.step()
            losses.append(total)
            if spec.validation and (step + 1) % spec.eval_every == 0:
                val_losses.append((step, _validate(hook, tg, model, task, loss_fn, spec)))
    finally:
        hook.close()
    unchanged = [name for name, p in model.named_parameters() if torch.equal(before[name], p.detach())]
    metrics = {
        "spec": asdict(spec),
        "losses": losses,
        "accuracies": accuracies,
        "val_losses": val_losses,
        "nonfinite": any(not math.isfinite(value) for value in losses),
        "unchanged_parameters": unchanged,
        "parameters": len(before),
    }
    with open(os.path.join(out_dir, METRICS_FILE), "w", encoding="utf-8") as file:
        json.dump(metrics, file)
    return os.fspath(out_dir)


def _validate(hook: Any, tg: Any, model: Any, task: Task, loss_fn: Any, spec: Spec) -> float:
    import torch

    hook.set_mode(tg.modes.EVAL)
    model.eval()
    values = []
    with torch.no_grad():
        for _ in range(2):
            x, y = task.eval_batch() if not spec.train_size or spec.data_fault != "leak" else task.train_batch()
            values.append(float(loss_fn(*_targets(model(_as_input(x, spec)), y, spec))))
    return sum(values) / len(values)
