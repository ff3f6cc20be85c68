"""Activation and loss I/O land in the collections rules select by (relu_output, labels...)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import trainguard.pytorch as tg  # noqa: E402
from trainguard.trial import create_trial  # noqa: E402

TYPED = ["relu_input", "relu_output", "tanh_input", "tanh_output", "sigmoid_input", "sigmoid_output", "labels", "predictions"]


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3), nn.Sigmoid())


def test_module_types_decide_collections_and_a_live_reader_sees_them(tmp_path):
    torch.manual_seed(0)
    model, loss_fn = _model(), nn.CrossEntropyLoss()
    hook = tg.Hook(str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=1), include_collections=TYPED + ["losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    labels_seen = []
    for _ in range(3):
        x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
        labels_seen.append(y.numpy().copy())
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    # Not closed: the run is live, and its collections file must already name the members.
    trial = create_trial(str(tmp_path / "run"), collection_wait_timeout=10)
    trial.wait_for_steps([1], timeout=30)
    members = {name: trial.tensor_names(collection=name) for name in TYPED}
    assert members["relu_input"] == ["1_input_0"] and members["relu_output"] == ["1_output_0"]
    assert members["tanh_input"] == ["3_input_0"] and members["tanh_output"] == ["3_output_0"]
    assert members["sigmoid_input"] == ["5_input_0"] and members["sigmoid_output"] == ["5_output_0"]
    assert members["predictions"] == ["CrossEntropyLoss_input_0"]
    assert members["labels"] == ["CrossEntropyLoss_input_1"]
    assert (trial.tensor("CrossEntropyLoss_input_1").value(1) == labels_seen[1]).all()
    hook.close()
    # Membership does not include anything: without those collections, no activation is saved.
    hook2 = tg.Hook(str(tmp_path / "run2"), save_config=tg.SaveConfig(save_interval=1), include_collections=["losses"])
    hook2.register_module(model)
    hook2.register_loss(loss_fn)
    loss_fn(model(torch.randn(5, 4)), torch.randint(0, 3, (5,))).backward()
    optimizer.step()
    hook2.close()
    healthy = create_trial(str(tmp_path / "run2"))
    assert healthy.tensor_names() == ["CrossEntropyLoss_output_0"]
    assert healthy.capture_stopped() == {}  # only a run whose capture failed has the marker


def test_zero_code_functional_loss_inputs_are_labels_and_predictions(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.nn.functional as F
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    """))
    config = tmp_path / "hook.json"
    config.write_text('{"LocalPath": "x", "CollectionConfigurations": [{"CollectionName": "labels"}, '
                      '{"CollectionName": "predictions"}, {"CollectionName": "relu_output"}], '
                      '"HookParameters": {"save_interval": "1"}}')
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "trainguard.cli", "run", "--out", str(out), "--config", str(config), "--",
                    sys.executable, str(script)], check=True, capture_output=True, timeout=120)
    trial = create_trial(str(out))
    assert trial.tensor_names(collection="labels") == ["loss_cross_entropy_input_1"]
    assert trial.tensor_names(collection="predictions") == ["loss_cross_entropy_input_0"]
    assert trial.tensor_names(collection="relu_output") == ["1_output_0"]
    assert trial.tensor("loss_cross_entropy_input_1").value(2).tolist() == [0, 1, 2, 0, 1, 2]
    assert trial.tensor("loss_cross_entropy_input_0").value(2).shape == (6, 3)


def test_losses_without_class_targets_file_no_labels(tmp_path):
    """Distillation (KL divergence to a teacher's distribution) and regression on integer targets
    (ratings) are not classification: a teacher's argmax or a rating read as a class made
    ClassImbalance report "class 0 has 40x as many labels as class 6" on a healthy distillation."""
    torch.manual_seed(0)
    student, teacher = nn.Linear(4, 3), nn.Linear(4, 3)
    kl, mse, focal = nn.KLDivLoss(reduction="batchmean"), nn.MSELoss(), _FocalLoss()
    hook = tg.Hook(str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=1),
                   include_collections=["labels", "predictions", "losses"])  # fmt: skip
    hook.register_module(student)
    for loss in (kl, mse, focal):
        hook.register_loss(loss)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
    for _ in range(2):
        x = torch.randn(5, 4)
        optimizer.zero_grad()
        out = student(x)
        ratings = torch.randint(1, 6, (5, 3)).float()
        total = kl(out.log_softmax(1), teacher(x).softmax(1).detach()) + mse(out, ratings)
        total = total + focal(out, torch.randint(0, 3, (5,)))
        total.backward()
        optimizer.step()
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    # a loss of the user's own (not a known regression/distillation loss) is still classification
    assert trial.tensor_names(collection="labels") == ["_FocalLoss_input_1"]
    assert trial.tensor_names(collection="predictions") == ["_FocalLoss_input_0"]


class _FocalLoss(nn.Module):
    def forward(self, logits, target):
        return nn.functional.cross_entropy(logits, target)


def test_model_inputs_hold_what_the_model_is_fed_not_every_layers_input(tmp_path):
    """The data rules (NotNormalizedData, CheckInputImages, NLPSequenceRatio) ask for
    ``model_inputs``: a root's inputs and integer inputs anywhere (token ids of an embedding that
    the root receives as a keyword). ``inputs`` would also save each layer's input, a second copy
    of the layer before's output: on the reference CNN half of a saved step's bytes."""

    class Tagger(nn.Module):  # token ids reach the embedding; the root is called with a keyword
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(20, 8), nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))

        def forward(self, *, ids):
            return self.head(self.embed(ids)).mean(1)

    torch.manual_seed(0)
    image_model, tagger = _model(), Tagger()
    hook = tg.Hook(
        str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=1), include_collections=["model_inputs"]
    )
    hook.register_module(image_model)
    hook.register_module(tagger)
    x, ids = torch.randn(5, 4), torch.randint(0, 20, (5, 7))
    image_model(x)
    tagger(ids=ids)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names(collection="model_inputs") == ["Sequential_input_0", "embed_input_0"]
    assert trial.tensor_names() == ["Sequential_input_0", "embed_input_0"]  # no layer's activation
    image_input, token_ids = trial.tensor("Sequential_input_0"), trial.tensor("embed_input_0")
    np.testing.assert_array_equal(image_input.value(image_input.steps()[0]), x.numpy())
    np.testing.assert_array_equal(token_ids.value(token_ids.steps()[0]), ids.numpy())
