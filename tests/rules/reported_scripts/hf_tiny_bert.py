"""A tiny Hugging Face ``Trainer`` run: BERT built from a config (random init), sequence
classification, as a user writes it (no trainguard code). Its attention key biases get an exactly
zero gradient by construction, which used to stop it at step 0."""

from __future__ import annotations

import argparse
import tempfile

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--steps", type=int, default=120)
    args = parser.parse_args()
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2)  # fmt: skip
    model = BertForSequenceClassification(config)
    ids = torch.randint(1, 200, (2048, 16), generator=torch.Generator().manual_seed(1))
    labels = (ids[:, :4] < 100).sum(dim=1).ge(2).long()  # learnable from the first tokens

    class Examples(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(ids)

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {"input_ids": ids[index], "labels": labels[index]}

    with tempfile.TemporaryDirectory() as output:
        arguments = TrainingArguments(output_dir=output, max_steps=args.steps, per_device_train_batch_size=16,
                                      learning_rate=args.lr, warmup_steps=10, logging_steps=40, save_strategy="no",
                                      report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)  # fmt: skip
        Trainer(model=model, args=arguments, train_dataset=Examples()).train()


if __name__ == "__main__":
    main()
