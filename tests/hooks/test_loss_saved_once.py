"""A model whose forward returns its loss (the loss module's or ``F.cross_entropy``'s result, as
Hugging Face models do) has that loss saved once, under its loss name, not again as the model's
output ``<Model>_output_0``; the model's other outputs are saved as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = """
import json, sys
import torch, torch.nn as nn
torch.manual_seed(0)
functional = sys.argv[1] == "functional"
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.loss = nn.CrossEntropyLoss()
    def forward(self, x, y):
        logits = self.body(x)
        return nn.functional.cross_entropy(logits, y) if functional else self.loss(logits, y)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for _ in range(3):
    x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
    loss = model(x, y)
    losses.append(loss.item())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
json.dump(losses, open(sys.argv[2], "w"))
"""


@pytest.mark.parametrize(("kind", "loss_name"), [("module", "loss_output_0"), ("functional", "loss_cross_entropy_output_0")])
def test_a_loss_returned_by_the_model_is_saved_once(tmp_path: Path, kind: str, loss_name: str) -> None:
    from trainguard.trial import create_trial

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    done = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "run", "--out", str(tmp_path / "run"), "--save-interval", "1",
         "--", sys.executable, str(script), kind, str(tmp_path / "losses.json")],
        env=environment, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    trial = create_trial(str(tmp_path / "run"), collection_wait_timeout=0)
    assert trial.tensor_names(collection="losses") == [loss_name]
    names = trial.tensor_names()
    assert "Net_output_0" not in names  # the same tensor as the loss: not saved twice
    assert "body_output_0" in names and "body.2_output_0" in names  # other outputs as before
    printed = json.loads((tmp_path / "losses.json").read_text())
    saved = [float(trial.tensor(loss_name).value(step)) for step in trial.tensor(loss_name).steps()]
    np.testing.assert_allclose(saved, printed, rtol=1e-6)
    scalars = [n for n in names if trial.tensor(n).value(0).size == 1 and "loss" not in n]
    assert scalars == []  # no other name holds the loss's value
