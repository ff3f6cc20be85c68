"""Hugging Face ``Trainer`` on a tiny BERT built from a config (random init, sequence classification)."""

from __future__ import annotations

import argparse
import os
import tempfile

import torch

from bench.stacks._timing import LoopTimer, add_device_argument


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=800)
    add_device_argument(parser)
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=64, num_labels=2)  # fmt: skip
    model = BertForSequenceClassification(config)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1000, (2048, 32), generator=generator)
    labels = (ids[:, 0] % 2).long()

    class Examples(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(ids)

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {"input_ids": ids[index], "attention_mask": torch.ones(32, dtype=torch.long), "labels": labels[index]}

    with tempfile.TemporaryDirectory() as output:
        arguments = TrainingArguments(output_dir=output, max_steps=args.steps, per_device_train_batch_size=16,
                                      learning_rate=5e-4, warmup_steps=10, logging_steps=10**6, save_strategy="no",
                                      report_to=[], use_cpu=args.device == "cpu", dataloader_num_workers=0, disable_tqdm=True)  # fmt: skip
        trainer = Trainer(model=model, args=arguments, train_dataset=Examples())
        with LoopTimer(args.device):
            trainer.train()


if __name__ == "__main__":
    main()
