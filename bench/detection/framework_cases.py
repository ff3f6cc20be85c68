"""Hugging Face ``Trainer`` and PyTorch Lightning cases on tiny models built from configs.

Registered only when ``transformers`` (with ``accelerate``) / ``lightning`` are importable; the
model's loss goes through a registered ``nn.CrossEntropyLoss`` (a ``compute_loss`` override for
the Trainer, the LightningModule's own loss module), as users wire trainguard's hook in.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.detection.harness import COLLECTIONS, METRICS_FILE
from bench.detection.registry import FAULTY, HEALTHY, Case
from bench.detection.tasks import LENGTH, VOCAB, Task


@dataclass(frozen=True)
class FrameworkSpec:
    framework: str = "hf"  # hf | lightning
    lr: float = 3e-3
    steps: int = 100
    batch: int = 16
    seed: int = 0
    save_interval: int = 1
    validation: bool = False
    # what Task reads
    task: str = "tokens"
    classes: int = 4
    separation: float = 0.8
    noise: float = 1.0
    label_noise: float = 0.0
    train_size: int = 0
    data_fault: str = "none"
    onset: int = 0
    zero_rows: float = 0.0
    epochs: int = 0  # HF: a many-epoch run of `steps` steps per epoch, an evaluation pass after each epoch
    eval_batches: int = 8  # batches per evaluation pass (epochs > 0)


def _dataset(spec: FrameworkSpec, examples: int) -> list[tuple[Any, Any]]:
    task = Task(spec)
    pairs = []
    while len(pairs) < examples:
        x, y = task.train_batch()
        pairs += list(zip(x, y, strict=True))
    return pairs[:examples]


def _finish(out_dir: str, spec: FrameworkSpec, losses: list[float], val_losses: list[Any] | None = None,
            unchanged: list[str] | None = None, parameters: int | None = None) -> None:  # fmt: skip
    metrics = {"spec": spec.__dict__, "losses": losses, "val_losses": val_losses or [], "parameters": parameters,
               "nonfinite": any(not math.isfinite(v) for v in losses), "unchanged_parameters": unchanged or []}  # fmt: skip
    with open(os.path.join(out_dir, METRICS_FILE), "w", encoding="utf-8") as file:
        json.dump(metrics, file)


def train_hf(out_dir: str, spec: FrameworkSpec) -> str:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    import trainguard.pytorch as tg

    torch.set_num_threads(1)
    torch.manual_seed(spec.seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=LENGTH, num_labels=spec.classes)  # fmt: skip
    model = BertForSequenceClassification(config)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    loss_fn = torch.nn.CrossEntropyLoss()
    hook = tg.Hook(out_dir, save_config=tg.SaveConfig(save_interval=spec.save_interval),
                   include_collections=list(COLLECTIONS))  # fmt: skip
    hook.register_module(model)
    hook.register_loss(loss_fn)
    losses: list[float] = []

    class Examples(torch.utils.data.Dataset):
        def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
            self.pairs = pairs

        def __len__(self) -> int:
            return len(self.pairs)

        def __getitem__(self, index: int) -> dict[str, Any]:
            tokens, label = self.pairs[index]
            return {"input_ids": torch.from_numpy(tokens), "labels": torch.tensor(int(label))}

    class HookedTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, **kwargs):  # type: ignore[no-untyped-def]
            labels = inputs.pop("labels")
            outputs = model(**inputs)
            loss = loss_fn(outputs.logits, labels)
            if model.training:
                losses.append(float(loss.detach()))
            return (loss, outputs) if return_outputs else loss

    if spec.epochs:  # Trainer's own epoch loop with an evaluation pass after every epoch
        schedule: dict[str, Any] = {"num_train_epochs": spec.epochs, "eval_strategy": "epoch",
                                    "per_device_eval_batch_size": spec.batch}  # fmt: skip
        total = spec.steps * spec.epochs
        evaluation = Examples(_dataset(FrameworkSpec(**{**spec.__dict__, "seed": spec.seed + 100}),
                                       spec.eval_batches * spec.batch))  # fmt: skip
    else:
        schedule, total, evaluation = {"max_steps": spec.steps}, spec.steps, None
    arguments = TrainingArguments(
        output_dir=os.path.join(out_dir, "hf"), per_device_train_batch_size=spec.batch,
        learning_rate=spec.lr, warmup_steps=total // 10, logging_strategy="no", save_strategy="no",
        report_to=[], use_cpu=True, seed=spec.seed, dataloader_num_workers=0, disable_tqdm=True, **schedule,
    )  # fmt: skip
    examples = Examples(_dataset(spec, spec.steps * spec.batch))
    trainer = HookedTrainer(model=model, args=arguments, train_dataset=examples, eval_dataset=evaluation)
    try:
        trainer.train()
    finally:
        hook.close()
    val_losses = [(h.get("step", 0), h["eval_loss"]) for h in trainer.state.log_history if "eval_loss" in h]
    unchanged = [name for name, p in model.named_parameters() if torch.equal(before[name], p.detach())]
    _finish(out_dir, spec, losses, val_losses, unchanged, len(before))
    return out_dir


def train_lightning(out_dir: str, spec: FrameworkSpec) -> str:
    import lightning
    import torch
    from torch import nn

    import trainguard.pytorch as tg

    torch.set_num_threads(1)
    torch.manual_seed(spec.seed)
    hook = tg.Hook(out_dir, save_config=tg.SaveConfig(save_interval=spec.save_interval),
                   include_collections=list(COLLECTIONS))  # fmt: skip
    losses: list[float] = []

    class Classifier(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
            self.loss_fn = nn.CrossEntropyLoss()

        def training_step(self, batch, index):  # type: ignore[no-untyped-def]
            hook.set_mode(tg.modes.TRAIN)
            x, y = batch
            loss = self.loss_fn(self.model(x), y)
            losses.append(float(loss.detach()))
            return loss

        def validation_step(self, batch, index):  # type: ignore[no-untyped-def]
            hook.set_mode(tg.modes.EVAL)
            x, y = batch
            return self.loss_fn(self.model(x), y)

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.Adam(self.parameters(), lr=spec.lr)

    module = Classifier()
    hook.register_module(module.model)
    hook.register_loss(module.loss_fn)

    def loader(examples: int, seed_offset: int) -> Any:
        pairs = _dataset(FrameworkSpec(**{**spec.__dict__, "seed": spec.seed + seed_offset}), examples)
        x = torch.tensor(np.stack([p[0] for p in pairs]))
        y = torch.tensor([int(p[1]) for p in pairs])
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=spec.batch)

    trainer = lightning.Trainer(
        max_steps=spec.steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=2 if spec.validation else 0, val_check_interval=10 if spec.validation else None,
    )  # fmt: skip
    try:
        trainer.fit(module, loader(spec.steps * spec.batch, 0), loader(64, 100) if spec.validation else None)
    finally:
        hook.close()
    _finish(out_dir, spec, losses)
    return out_dir


def _importable(*names: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in names)


def framework_cases() -> list[Case]:
    cases: list[Case] = []
    F = FrameworkSpec
    if _importable("transformers", "accelerate"):  # the Trainer needs accelerate
        cases += [
            Case("healthy-hf-trainer-tiny-bert", "frameworks", HEALTHY, train_hf, F(), (), 0, "learns",
                 "HF Trainer, BERT from a config, random init, warm-up"),  # fmt: skip
            Case("healthy-hf-trainer-tiny-bert-s1", "frameworks", HEALTHY, train_hf, F(seed=1, save_interval=2),
                 (), 0, "learns", "HF Trainer, BERT from a config, save every 2"),  # fmt: skip
            Case("fault-hf-trainer-lr-100", "frameworks", FAULTY, train_hf, F(lr=100.0),
                 ("ExplodingTensor", "WeightUpdateRatio", "LossNotDecreasing"), 0, "no_learning",
                 "HF Trainer at learning rate 100"),  # fmt: skip
        ]
        # many epochs, an evaluation pass of 8 batches after each, saved every 10 steps (the
        # default interval): the saved EVAL steps fall at another batch of each pass
        many = {"steps": 16, "save_interval": 10}
        lr_high = ("ExplodingTensor", "WeightUpdateRatio", "LossNotDecreasing")
        cases += [
            Case("healthy-hf-trainer-5-epochs-eval", "hf_epochs", HEALTHY, train_hf, F(epochs=5, **many), (), 0,
                 "learns", "HF Trainer, 5 epochs, evaluation every epoch"),  # fmt: skip
            Case("healthy-hf-trainer-8-epochs-eval", "hf_epochs", HEALTHY, train_hf, F(epochs=8, seed=1, **many),
                 (), 0, "learns", "HF Trainer, 8 epochs, evaluation every epoch"),  # fmt: skip
            Case("fault-hf-trainer-5-epochs-lr-100", "hf_epochs", FAULTY, train_hf, F(epochs=5, lr=100.0, **many),
                 lr_high, 0, "no_learning", "HF Trainer, 5 epochs with evaluation, learning rate 100"),  # fmt: skip
            Case("fault-hf-trainer-8-epochs-lr-100", "hf_epochs", FAULTY, train_hf,
                 F(epochs=8, lr=100.0, seed=1, **many), lr_high, 0, "no_learning",
                 "HF Trainer, 8 epochs with evaluation, learning rate 100"),  # fmt: skip
            Case("fault-hf-trainer-5-epochs-lr-0", "hf_epochs", FAULTY, train_hf, F(epochs=5, lr=0.0, **many),
                 ("UnchangedTensor", "WeightUpdateRatio", "LossNotDecreasing"), 0, "frozen",
                 "HF Trainer, 5 epochs with evaluation, learning rate 0"),  # fmt: skip
        ]
    if _importable("lightning"):
        cases += [
            Case("healthy-lightning-mlp", "frameworks", HEALTHY, train_lightning, F(framework="lightning", lr=3e-3,
                 task="features"), (), 0, "learns", "Lightning, MLP, no validation"),  # fmt: skip
            Case("healthy-lightning-mlp-val", "frameworks", HEALTHY, train_lightning,
                 F(framework="lightning", lr=3e-3, task="features", seed=1, validation=True), (), 0, "learns",
                 "Lightning, MLP, validation every 10 steps"),  # fmt: skip
            Case("fault-lightning-lr-100", "frameworks", FAULTY, train_lightning,
                 F(framework="lightning", lr=100.0, task="features"),
                 ("ExplodingTensor", "WeightUpdateRatio", "LossNotDecreasing"), 0, "no_learning",
                 "Lightning at learning rate 100"),  # fmt: skip
        ]
    return cases
