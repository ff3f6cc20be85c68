"""A tiny Hugging Face ``Trainer`` run: BERT built from a config (random init), sequence
classification, as a user writes it (no trainguard code). Its attention key biases get an exactly
zero gradient by construction, which used to stop it at step 0. With ``--epochs N`` the Trainer
runs its own epoch loop with an evaluation pass of 8 batches after every epoch (the shape of run
Overfit once stopped at epoch 5, comparing one batch of each pass with another of the next)."""

from __future__ import annotations

import argparse
import tempfile

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--steps", type=int, default=120, help="training steps (per epoch with --epochs)")
    parser.add_argument("--epochs", type=int, default=0, help="epochs, evaluated after each (0: --steps in all)")
    args = parser.parse_args()
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2)  # fmt: skip
    model = BertForSequenceClassification(config)

    class Examples(torch.utils.data.Dataset):
        def __init__(self, size: int, seed: int) -> None:
            self.ids = torch.randint(1, 200, (size, 16), generator=torch.Generator().manual_seed(seed))
            self.labels = (self.ids[:, :4] < 100).sum(dim=1).ge(2).long()  # learnable from the first tokens

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.ids[index], "labels": self.labels[index]}

    if args.epochs:
        schedule = {"num_train_epochs": args.epochs, "eval_strategy": "epoch", "per_device_eval_batch_size": 16}
        train, evaluation = Examples(args.steps * 16, 1), Examples(8 * 16, 2)
    else:
        schedule, train, evaluation = {"max_steps": args.steps}, Examples(2048, 1), None

    with tempfile.TemporaryDirectory() as output:
        arguments = TrainingArguments(output_dir=output, per_device_train_batch_size=16, **schedule,
                                      learning_rate=args.lr, warmup_steps=10, logging_steps=40, save_strategy="no",
                                      report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)  # fmt: skip
        Trainer(model=model, args=arguments, train_dataset=train, eval_dataset=evaluation).train()


if __name__ == "__main__":
    main()
