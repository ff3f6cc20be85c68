"""PyTorch Lightning ``Trainer.fit`` on a small MLP classifier."""

from __future__ import annotations

import argparse
import tempfile

import torch
from torch import nn

from bench.stacks._timing import LoopTimer, add_device_argument


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5000)
    add_device_argument(parser)
    args = parser.parse_args()
    import lightning

    torch.manual_seed(0)
    torch.set_num_threads(1)

    class Classifier(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))
            self.criterion = nn.CrossEntropyLoss()

        def training_step(self, batch, index):  # type: ignore[no-untyped-def]
            x, y = batch
            return self.criterion(self.net(x), y)

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    x = torch.randn(4096, 32)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True)
    with tempfile.TemporaryDirectory() as root:
        trainer = lightning.Trainer(max_steps=args.steps, accelerator="gpu" if args.device == "cuda" else "cpu", devices=1, logger=False,
                                    enable_checkpointing=False, enable_progress_bar=False,
                                    enable_model_summary=False, default_root_dir=root)  # fmt: skip
        with LoopTimer(args.device):
            trainer.fit(Classifier(), loader)


if __name__ == "__main__":
    main()
